package zmqio

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// TCPEndpoint formats a ZMQ tcp endpoint, bracketing IPv6 literals as upstream's
// NetworkAddress.to_tcp does (tcp://[::1]:5555).
func TCPEndpoint(host string, port int) string {
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port))
}

func isIPv6(host string) bool { return strings.Contains(host, ":") }

// endpointPort extracts the port from a ZMQ last-endpoint string like tcp://1.2.3.4:5555.
func endpointPort(ep string) (int, error) {
	i := strings.LastIndexByte(ep, ':')
	if i < 0 {
		return 0, fmt.Errorf("no port in endpoint %q", ep)
	}
	p, err := strconv.Atoi(ep[i+1:])
	if err != nil || p <= 0 || p > 65535 {
		return 0, fmt.Errorf("bad port in endpoint %q", ep)
	}
	return p, nil
}
