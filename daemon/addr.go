package daemon

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
)

// Two addresses, kept apart, so that a multi-host deployment can bind one
// address and advertise another:
//
//   - the listen host (Config.ListenHost, kvxferd -host): where the hosted
//     bootstrap HTTP server and the ZMQ PULL socket bind. SGLang's --host
//     meaning; a wildcard (0.0.0.0, ::) listens on every interface;
//   - the advertised address (Config.HostIP, kvxferd -advertise-host): the
//     rank_ip published in PUT /route, which every decode connects its PUSH
//     socket to. It must be an address decodes can reach, never a wildcard.
//
// ResolveAddrs picks the advertised address and refuses configurations that
// would make remote decodes send their frames to themselves or nowhere.

// Env variables read for the advertised address, as SGLang's get_local_ip_auto.
const (
	EnvHostIP       = "SGLANG_HOST_IP"
	EnvHostIPLegacy = "HOST_IP"
	EnvLocalIPNIC   = "SGLANG_LOCAL_IP_NIC"
)

// AddrSource says where the advertised address came from.
type AddrSource string

const (
	AddrExplicit AddrSource = "explicit"    // -advertise-host, SGLANG_HOST_IP or HOST_IP
	AddrListen   AddrSource = "listen-host" // the (specific) listen host itself
	AddrNIC      AddrSource = "nic"         // SGLANG_LOCAL_IP_NIC's address
	AddrRoute    AddrSource = "route"       // source address of the route to 8.8.8.8 (or 2001:4860:4860::8888)
	AddrHostname AddrSource = "hostname"    // the host name's first address
)

// Addrs is a resolved address configuration.
type Addrs struct {
	Listen     string     // bind host for the bootstrap server and the ZMQ PULL socket
	Advertise  string     // rank_ip published to decodes
	Source     AddrSource // how Advertise was found
	SingleHost bool       // every decode runs on this host (loopback allowed)
	Warning    string     // a legal but suspicious combination, for the log
}

// Detector holds the facts SGLang's get_local_ip_auto reads, injectable for
// tests. Zero fields take the host's (see SystemDetector).
type Detector struct {
	Getenv func(string) string
	// NICAddrs lists the addresses of one network interface.
	NICAddrs func(name string) ([]net.IP, error)
	// RouteSource is the local address a UDP socket "connected" to addr
	// (host:port) gets: the source address of the route there. No packet is sent.
	RouteSource func(addr string) (net.IP, error)
	Hostname    func() (string, error)
	LookupIP    func(host string) ([]net.IP, error)
}

// SystemDetector reads this host.
func SystemDetector(getenv func(string) string) Detector {
	return Detector{
		Getenv: getenv,
		NICAddrs: func(name string) ([]net.IP, error) {
			ifc, err := net.InterfaceByName(name)
			if err != nil {
				return nil, err
			}
			as, err := ifc.Addrs()
			if err != nil {
				return nil, err
			}
			var ips []net.IP
			for _, a := range as {
				if n, ok := a.(*net.IPNet); ok {
					ips = append(ips, n.IP)
				}
			}
			return ips, nil
		},
		RouteSource: func(addr string) (net.IP, error) {
			c, err := net.Dial("udp", addr) // connect(2) on UDP: a route lookup, nothing sent
			if err != nil {
				return nil, err
			}
			defer c.Close()
			return c.LocalAddr().(*net.UDPAddr).IP, nil
		},
		Hostname: os.Hostname,
		LookupIP: net.LookupIP,
	}
}

// ErrNoLocalIP is returned when no advertised address can be detected.
var ErrNoLocalIP = errors.New("cannot detect this host's IP")

// DetectLocalIP is SGLang's get_local_ip_auto (sglang/srt/utils/network.py,
// 0.5.18 to 0.5.23), in its order: SGLANG_HOST_IP, else HOST_IP; else the
// interface named by SGLANG_LOCAL_IP_NIC (its first IPv4 address other than
// 127.0.0.1 and 0.0.0.0, else its first IPv6 address that is neither
// link-local fe80:: nor ::1); else the source address of the route to
// 8.8.8.8:80, then to [2001:4860:4860::8888]:80 (a UDP connect: no packet is
// sent); else the host name's first address unless it is 127.0.0.1, 0.0.0.0
// or ::1.
func DetectLocalIP(d Detector) (string, AddrSource, error) {
	if d.Getenv != nil {
		if v := d.Getenv(EnvHostIP); v != "" {
			return v, AddrExplicit, nil
		}
		if v := d.Getenv(EnvHostIPLegacy); v != "" {
			return v, AddrExplicit, nil
		}
		if nic := d.Getenv(EnvLocalIPNIC); nic != "" && d.NICAddrs != nil {
			if ips, err := d.NICAddrs(nic); err == nil {
				if ip := nicIP(ips); ip != "" {
					return ip, AddrNIC, nil
				}
			}
		}
	}
	if d.RouteSource != nil {
		for _, probe := range []string{"8.8.8.8:80", "[2001:4860:4860::8888]:80"} {
			if ip, err := d.RouteSource(probe); err == nil && ip != nil {
				return ip.String(), AddrRoute, nil
			}
		}
	}
	if d.Hostname != nil && d.LookupIP != nil {
		if h, err := d.Hostname(); err == nil && h != "" {
			if ips, err := d.LookupIP(h); err == nil && len(ips) > 0 {
				if ip := ips[0]; !ip.Equal(net.IPv4(127, 0, 0, 1)) && !ip.IsUnspecified() && !ip.Equal(net.IPv6loopback) {
					return ip.String(), AddrHostname, nil
				}
			}
		}
	}
	return "", "", ErrNoLocalIP
}

func nicIP(ips []net.IP) string {
	for _, ip := range ips {
		if v4 := ip.To4(); v4 != nil && !v4.Equal(net.IPv4(127, 0, 0, 1)) && !v4.IsUnspecified() {
			return v4.String()
		}
	}
	for _, ip := range ips {
		if ip.To4() == nil && !ip.IsLinkLocalUnicast() && !ip.Equal(net.IPv6loopback) {
			return ip.String()
		}
	}
	return ""
}

// hostKind classifies an address literal; names other than localhost are
// "specific" (they are the operator's choice and resolve elsewhere).
func hostKind(h string) (wildcard, loopback bool) {
	h = strings.Trim(h, "[]")
	if strings.EqualFold(h, "localhost") {
		return false, true
	}
	ip := net.ParseIP(h)
	if ip == nil {
		return false, false
	}
	return ip.IsUnspecified(), ip.IsLoopback()
}

// ResolveAddrs resolves the advertised address and checks the pair:
//
//   - listen "" means 127.0.0.1 (SGLang's --host default);
//   - advertise "" is detected: the listen host itself when it is a specific
//     address, else DetectLocalIP (SGLANG_HOST_IP, HOST_IP,
//     SGLANG_LOCAL_IP_NIC, the route to 8.8.8.8, the host name);
//   - a loopback listen host implies a single-host setup (no remote decode
//     can reach it); otherwise singleHost must be set for a loopback
//     advertised address.
//
// Refused: an unspecified advertised address (0.0.0.0, ::: decodes would
// send to themselves); a loopback advertised address while decodes can be
// remote (non-loopback listen host) and singleHost is false; a non-loopback
// advertised address with a loopback listen host (nothing listens there); a
// listen host that is not an IP literal or localhost.
func ResolveAddrs(listen, advertise string, singleHost bool, d Detector) (Addrs, error) {
	if listen == "" {
		listen = "127.0.0.1"
	}
	if strings.EqualFold(listen, "localhost") {
		listen = "127.0.0.1"
	}
	listen = strings.Trim(listen, "[]")
	if net.ParseIP(listen) == nil {
		return Addrs{}, fmt.Errorf("listen host %q: want an IP address (0.0.0.0 or :: for every interface)", listen)
	}
	lWild, lLoop := hostKind(listen)
	a := Addrs{Listen: listen, SingleHost: singleHost || lLoop}
	switch {
	case advertise != "":
		a.Advertise, a.Source = strings.Trim(advertise, "[]"), AddrExplicit
	case !lWild:
		a.Advertise, a.Source = listen, AddrListen
	default:
		ip, src, err := DetectLocalIP(d)
		if err != nil {
			return a, fmt.Errorf("listening on %s, but no address to advertise to decodes: %w; set SGLANG_HOST_IP (or -advertise-host) to this host's IP, or SGLANG_LOCAL_IP_NIC to the interface decodes reach", listen, err)
		}
		a.Advertise, a.Source = strings.Trim(ip, "[]"), src
	}
	aWild, aLoop := hostKind(a.Advertise)
	switch {
	case aWild:
		return a, fmt.Errorf("advertised address %s (%s) is unspecified: decodes would send their frames to themselves; set SGLANG_HOST_IP (or -advertise-host) to this host's IP", a.Advertise, a.Source)
	case aLoop && !a.SingleHost:
		return a, fmt.Errorf("advertised address %s (%s) is loopback while decodes can be remote (listening on %s); set SGLANG_HOST_IP (or -advertise-host) to this host's IP, or -single-host if every decode runs on this host", a.Advertise, a.Source, listen)
	case lLoop && !aLoop:
		return a, fmt.Errorf("listening on %s (loopback) but decodes are told %s (%s): nothing would answer there; use -host 0.0.0.0 or -host %s", listen, a.Advertise, a.Source, a.Advertise)
	}
	if !lWild && !lLoop && a.Advertise != listen {
		a.Warning = fmt.Sprintf("listening on %s but advertising %s: decodes reach this rank only if %s forwards to %s", listen, a.Advertise, a.Advertise, listen)
	}
	return a, nil
}

// RegistrationHost is the host kvxferd uses to reach a bootstrap server it
// hosts on listen: a wildcard is not an address one can connect to, so it
// becomes the loopback of its family (127.0.0.1 for 0.0.0.0, ::1 for ::), as
// SGLang's register_to_bootstrap does; any other host is used as is.
func RegistrationHost(listen string) string {
	switch ip := net.ParseIP(strings.Trim(listen, "[]")); {
	case ip == nil:
		return listen
	case ip.Equal(net.IPv4zero):
		return "127.0.0.1"
	case ip.Equal(net.IPv6unspecified):
		return "::1"
	}
	return strings.Trim(listen, "[]")
}

// hostedBootstrapURL is the URL kvxferd registers its rank at when it hosts
// the bootstrap server: the listener's port on RegistrationHost(listen host).
func (d *Daemon) hostedBootstrapURL() string {
	_, port, _ := net.SplitHostPort(d.bootLn.Addr().String())
	return "http://" + net.JoinHostPort(RegistrationHost(d.cfg.ListenHost), port)
}

// ReachableURL rewrites a wildcard host in an http://host:port URL to
// RegistrationHost's loopback (http://0.0.0.0:8998 -> http://127.0.0.1:8998,
// http://[::]:8998 -> http://[::1]:8998); anything else is returned as is.
func ReachableURL(u string) string {
	rest, ok := strings.CutPrefix(u, "http://")
	if !ok {
		return u
	}
	hostport, path, _ := strings.Cut(rest, "/")
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return u
	}
	if wild, _ := hostKind(host); !wild {
		return u
	}
	out := "http://" + net.JoinHostPort(RegistrationHost(host), port)
	if path != "" || strings.Contains(rest, "/") {
		out += "/" + path
	}
	return out
}
