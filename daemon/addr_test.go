package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/kv"
)

// fakeHost is a Detector over a made-up host.
type fakeHost struct {
	env      map[string]string
	nics     map[string][]net.IP
	route4   net.IP // nil: no route to 8.8.8.8
	route6   net.IP
	hostname string
	names    map[string][]net.IP
	probes   []string
}

func (f *fakeHost) detector() Detector {
	return Detector{
		Getenv: func(k string) string { return f.env[k] },
		NICAddrs: func(n string) ([]net.IP, error) {
			ips, ok := f.nics[n]
			if !ok {
				return nil, errors.New("no such interface")
			}
			return ips, nil
		},
		RouteSource: func(addr string) (net.IP, error) {
			f.probes = append(f.probes, addr)
			ip := f.route4
			if strings.HasPrefix(addr, "[") {
				ip = f.route6
			}
			if ip == nil {
				return nil, errors.New("network is unreachable")
			}
			return ip, nil
		},
		Hostname: func() (string, error) { return f.hostname, nil },
		LookupIP: func(h string) ([]net.IP, error) {
			ips, ok := f.names[h]
			if !ok {
				return nil, errors.New("no such host")
			}
			return ips, nil
		},
	}
}

func ips(s ...string) []net.IP {
	var out []net.IP
	for _, x := range s {
		out = append(out, net.ParseIP(x))
	}
	return out
}

func TestDetectLocalIPOrder(t *testing.T) {
	for _, tc := range []struct {
		name string
		host fakeHost
		want string
		src  AddrSource
	}{
		{"SGLANG_HOST_IP first", fakeHost{env: map[string]string{EnvHostIP: "10.0.0.5", EnvHostIPLegacy: "10.0.0.6"}, route4: net.ParseIP("10.1.1.1")}, "10.0.0.5", AddrExplicit},
		{"HOST_IP second", fakeHost{env: map[string]string{EnvHostIPLegacy: "10.0.0.6"}, route4: net.ParseIP("10.1.1.1")}, "10.0.0.6", AddrExplicit},
		{"NIC: first IPv4 that is not 127.0.0.1 or 0.0.0.0", fakeHost{env: map[string]string{EnvLocalIPNIC: "eth1"},
			nics: map[string][]net.IP{"eth1": ips("fe80::1", "127.0.0.1", "0.0.0.0", "192.0.2.7", "192.0.2.8")}, route4: net.ParseIP("10.1.1.1")}, "192.0.2.7", AddrNIC},
		{"NIC: IPv6 when no IPv4, link-local and ::1 skipped", fakeHost{env: map[string]string{EnvLocalIPNIC: "eth1"},
			nics: map[string][]net.IP{"eth1": ips("fe80::1", "::1", "2001:db8::9")}}, "2001:db8::9", AddrNIC},
		{"NIC without a usable address falls through to the route", fakeHost{env: map[string]string{EnvLocalIPNIC: "lo"},
			nics: map[string][]net.IP{"lo": ips("127.0.0.1", "::1")}, route4: net.ParseIP("10.1.1.1")}, "10.1.1.1", AddrRoute},
		{"missing NIC falls through to the route", fakeHost{env: map[string]string{EnvLocalIPNIC: "nope"}, route4: net.ParseIP("10.1.1.1")}, "10.1.1.1", AddrRoute},
		{"IPv6 route when no IPv4 route", fakeHost{route6: net.ParseIP("2001:db8::1")}, "2001:db8::1", AddrRoute},
		{"host name when no route", fakeHost{hostname: "p1", names: map[string][]net.IP{"p1": ips("192.0.2.1", "10.0.0.1")}}, "192.0.2.1", AddrHostname},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, src, err := DetectLocalIP(tc.host.detector())
			if err != nil || got != tc.want || src != tc.src {
				t.Fatalf("got %q %q %v, want %q %q", got, src, err, tc.want, tc.src)
			}
		})
	}
}

func TestDetectLocalIPFails(t *testing.T) {
	for _, loop := range []string{"127.0.0.1", "0.0.0.0", "::1"} {
		f := fakeHost{hostname: "p1", names: map[string][]net.IP{"p1": ips(loop, "192.0.2.1")}}
		// SGLang takes the first address only and skips it when it is loopback.
		if got, _, err := DetectLocalIP(f.detector()); !errors.Is(err, ErrNoLocalIP) {
			t.Fatalf("host name resolving to %s first: got %q, %v", loop, got, err)
		}
		if len(f.probes) != 2 || f.probes[0] != "8.8.8.8:80" || f.probes[1] != "[2001:4860:4860::8888]:80" {
			t.Fatalf("route probes %v", f.probes)
		}
	}
}

func TestResolveAddrs(t *testing.T) {
	routed := fakeHost{route4: net.ParseIP("192.0.2.1")}
	for _, tc := range []struct {
		name              string
		listen, advertise string
		single            bool
		host              fakeHost
		want              Addrs
	}{
		{"default is loopback, single host implied", "", "", false, routed,
			Addrs{Listen: "127.0.0.1", Advertise: "127.0.0.1", Source: AddrListen, SingleHost: true}},
		{"localhost", "localhost", "", false, routed,
			Addrs{Listen: "127.0.0.1", Advertise: "127.0.0.1", Source: AddrListen, SingleHost: true}},
		{"specific listen host is advertised", "192.0.2.1", "", false, fakeHost{},
			Addrs{Listen: "192.0.2.1", Advertise: "192.0.2.1", Source: AddrListen}},
		{"0.0.0.0: detected by route", "0.0.0.0", "", false, routed,
			Addrs{Listen: "0.0.0.0", Advertise: "192.0.2.1", Source: AddrRoute}},
		{":: with SGLANG_HOST_IP", "::", "", false, fakeHost{env: map[string]string{EnvHostIP: "2001:db8::2"}},
			Addrs{Listen: "::", Advertise: "2001:db8::2", Source: AddrExplicit}},
		{"[::] bracketed", "[::]", "", false, routed,
			Addrs{Listen: "::", Advertise: "192.0.2.1", Source: AddrRoute}},
		{"explicit advertise beats detection", "0.0.0.0", "192.0.2.9", false, routed,
			Addrs{Listen: "0.0.0.0", Advertise: "192.0.2.9", Source: AddrExplicit}},
		{"loopback advertised on a wildcard listener with -single-host", "0.0.0.0", "127.0.0.1", true, routed,
			Addrs{Listen: "0.0.0.0", Advertise: "127.0.0.1", Source: AddrExplicit, SingleHost: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ResolveAddrs(tc.listen, tc.advertise, tc.single, tc.host.detector())
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestResolveAddrsWarnsOnForwardedAddress(t *testing.T) {
	got, err := ResolveAddrs("192.0.2.1", "198.51.100.1", false, Detector{})
	if err != nil || !strings.Contains(got.Warning, "198.51.100.1") {
		t.Fatalf("%+v %v", got, err)
	}
}

func TestResolveAddrsRefuses(t *testing.T) {
	for _, tc := range []struct {
		name              string
		listen, advertise string
		single            bool
		host              fakeHost
		want              string
	}{
		{"advertise 0.0.0.0", "0.0.0.0", "0.0.0.0", false, fakeHost{}, "unspecified"},
		{"advertise :: even single-host", "0.0.0.0", "::", true, fakeHost{}, "unspecified"},
		{"SGLANG_HOST_IP=0.0.0.0 on a wildcard listener", "0.0.0.0", "", false,
			fakeHost{env: map[string]string{EnvHostIP: "0.0.0.0"}}, "unspecified"},
		{"advertise loopback while remote decodes possible", "0.0.0.0", "127.0.0.1", false, fakeHost{}, "loopback while decodes can be remote"},
		{"detected loopback on a wildcard listener", "::", "", false,
			fakeHost{env: map[string]string{EnvHostIP: "::1"}}, "loopback while decodes can be remote"},
		{"listen on an interface, advertise loopback", "192.0.2.1", "localhost", false, fakeHost{}, "loopback while decodes can be remote"},
		{"listen loopback, advertise an address nobody listens on", "127.0.0.1", "192.0.2.1", false, fakeHost{}, "nothing would answer"},
		{"nothing detected", "0.0.0.0", "", false, fakeHost{}, "SGLANG_HOST_IP"},
		{"listen host name", "prefill-1", "", false, fakeHost{}, "want an IP address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ResolveAddrs(tc.listen, tc.advertise, tc.single, tc.host.detector())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %+v, %v; want an error containing %q", got, err, tc.want)
			}
		})
	}
}

func TestRegistrationHost(t *testing.T) {
	for in, want := range map[string]string{
		"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1", "192.0.2.1": "192.0.2.1", "127.0.0.1": "127.0.0.1", "2001:db8::1": "2001:db8::1",
	} {
		if got := RegistrationHost(in); got != want {
			t.Errorf("RegistrationHost(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestReachableURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://0.0.0.0:8998":       "http://127.0.0.1:8998",
		"http://[::]:8998":          "http://[::1]:8998",
		"http://0.0.0.0:8998/route": "http://127.0.0.1:8998/route",
		"http://192.0.2.1:8998":     "http://192.0.2.1:8998",
		"http://[2001:db8::1]:80/":  "http://[2001:db8::1]:80/",
		"":                          "",
		"https://0.0.0.0:1":         "https://0.0.0.0:1",
	} {
		if got := ReachableURL(in); got != want {
			t.Errorf("ReachableURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// A wildcard listener (IPv4 and IPv6): decodes are told the advertised
// address, kvxferd registers itself at a reachable URL (with its owner key:
// the hosted server refuses its PUT otherwise), and a room moves over it.
func TestDaemonWildcardListenAdvertisesAndRegistersReachably(t *testing.T) {
	for _, tc := range []struct{ listen, advertise, regHost string }{
		{"0.0.0.0", "127.0.0.1", "127.0.0.1"},
		{"::", "::1", "[::1]"},
	} {
		t.Run(tc.listen, func(t *testing.T) {
			if tc.listen == "::" {
				if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
					t.Skipf("no IPv6 loopback here: %v", err)
				} else {
					ln.Close()
				}
			}
			d := startDaemonWith(t, func(c *Config) { c.ListenHost, c.HostIP, c.SingleHost = tc.listen, tc.advertise, true })
			_, port, _ := net.SplitHostPort(d.BootstrapAddr())
			if host, _, _ := net.SplitHostPort(d.BootstrapAddr()); host != "0.0.0.0" && host != "::" {
				t.Fatalf("bootstrap listens on %s, want every interface", d.BootstrapAddr())
			}
			if u := d.hostedBootstrapURL(); u != "http://"+tc.regHost+":"+port {
				t.Fatalf("kvxferd registers at %s", u)
			}
			s := newScheduler(t, d) // goes live: PUT /route must have reached the hosted server
			dec := newDecode(t, d)
			resp, err := http.Get("http://" + tc.regHost + ":" + port + "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0")
			if err != nil {
				t.Fatal(err)
			}
			var ep struct {
				RankIP   string `json:"rank_ip"`
				RankPort int    `json:"rank_port"`
			}
			json.NewDecoder(resp.Body).Decode(&ep)
			resp.Body.Close()
			if ep.RankIP != tc.advertise || ep.RankPort != d.PullPort() {
				t.Fatalf("GET /route gave %+v, want %s:%d", ep, tc.advertise, d.PullPort())
			}
			const id = 77
			dst := []int32{8, 9}
			dec.checker.Expect(id, 1, false)
			dec.send(t, dec.info(id, dst, 3, 1))
			s.start(t, roomSpec{id: id, src: []int32{1, 2}, chunks: []int{2}, aux: 3})
			if rep := s.waitTerminal(t, id); rep.Status != kv.StatusSuccess {
				t.Fatalf("room ended %v/%v", rep.Status, rep.Reason)
			}
			dec.verify(t, id, dst, 3)
		})
	}
}

func TestDaemonStartRefusesUnreachableAdvertisedAddress(t *testing.T) {
	for _, c := range []Config{
		{ListenHost: "0.0.0.0", HostIP: "127.0.0.1"},
		{ListenHost: "0.0.0.0", HostIP: "0.0.0.0", SingleHost: true},
		{HostIP: "0.0.0.0"},
	} {
		c.ControlEndpoint = "ipc:///nonexistent-dir/never-bound.sock"
		if d, err := Start(c); err == nil {
			d.Shutdown(context.Background())
			t.Fatalf("Start(%+v) succeeded", c)
		} else if !strings.Contains(err.Error(), "advertised address") {
			t.Fatalf("Start(%+v): %v", c, err)
		}
	}
}
