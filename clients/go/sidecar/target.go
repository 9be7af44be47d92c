package sidecar

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"

	"google.golang.org/grpc/resolver"
)

// TargetForms are the targets every client of this repository accepts.
const TargetForms = "unix:PATH, unix:///ABS/PATH, a bare socket path (/abs, ./rel, ../rel), HOST:PORT, " +
	"[IPV6]:PORT, tcp:HOST:PORT (or tcp://HOST:PORT), dns:[//AUTHORITY/]HOST:PORT"

// normalizeTarget turns the client's forms into grpc-go's: a bare socket path
// gets "unix:", "tcp:" (and "tcp://") is dropped.
func normalizeTarget(target string) (string, error) {
	switch {
	case strings.HasPrefix(target, "/"), strings.HasPrefix(target, "./"), strings.HasPrefix(target, "../"):
		target = "unix:" + target
	case strings.HasPrefix(target, "tcp:"):
		addr := strings.TrimPrefix(strings.TrimPrefix(target, "tcp:"), "//")
		return addr, checkAddr(addr)
	}
	return target, checkTarget(target)
}

// ErrInvalidTarget is wrapped by the error of Dial for a target that cannot
// be dialled however long one waits ("host:", ":99999", "unix:", ...).
var ErrInvalidTarget = errors.New("invalid target")

// unixPathMax is the longest Unix socket path in bytes: a sockaddr_un's
// 108-byte sun_path less its terminating NUL (an abstract name's leading NUL
// takes that byte). The sidecar refuses to listen on a longer path and gRPC's
// C-core refuses to dial one, so a longer path can never reach a sidecar.
const unixPathMax = 107

// checkTarget rejects a target gRPC would accept and then fail to connect
// to forever (the resolver's error only shows as TRANSIENT_FAILURE): it reads
// unix:, unix-abstract: and dns: targets and bare addresses the way gRPC's
// resolvers do. A target of another registered scheme (passthrough:, xds:,
// your own) is left to its resolver.
func checkTarget(target string) error {
	if target == "" {
		return errors.New("empty target")
	}
	u, err := url.Parse(target)
	if err == nil && u.Scheme != "" && resolver.Get(u.Scheme) != nil &&
		u.Scheme != "unix" && u.Scheme != "unix-abstract" && u.Scheme != "dns" {
		return fmt.Errorf("scheme %q is not one of the client's target forms (%s)", u.Scheme, TargetForms)
	}
	if err != nil || u.Scheme == "" || resolver.Get(u.Scheme) == nil {
		if strings.HasPrefix(target, "unix:") || strings.HasPrefix(target, "unix-abstract:") || strings.HasPrefix(target, "dns:") {
			return fmt.Errorf("not a valid URL: %v", err)
		}
		return checkAddr(target) // gRPC reads it as dns:///target
	}
	switch u.Scheme {
	case "unix", "unix-abstract":
		if u.Host != "" {
			return fmt.Errorf("a unix target has no authority (%q): write unix:/abs/path, unix:rel/path or unix:///abs/path", u.Host)
		}
		path := u.Path // as gRPC's unix resolver reads it (Endpoint drops a leading "/")
		if path == "" {
			path = u.Opaque
		}
		if path == "" {
			return errors.New("no socket path after " + u.Scheme + ":")
		}
		if len(path) > unixPathMax {
			return fmt.Errorf("a Unix socket path may be at most %d bytes; this one is %d", unixPathMax, len(path))
		}
		if fi, err := os.Stat(path); u.Scheme == "unix" && err == nil && fi.IsDir() {
			return fmt.Errorf("%s is a directory, not a socket", path)
		}
	case "dns":
		return checkAddr(resolver.Target{URL: *u}.Endpoint())
	}
	return nil
}

// checkAddr checks host:port or [ipv6]:port: a host and a port are always given.
func checkAddr(addr string) error {
	if addr == "" {
		return errors.New("no address (want host:port)")
	}
	if _, err := netip.ParseAddr(addr); err == nil {
		return errors.New("no port (want host:port, [ipv6]:port)")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want host:port (a port is always given): %v", err)
	}
	if port == "" {
		return errors.New("empty port (want host:port)")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	if host == "" {
		return errors.New("no host (want host:port)")
	}
	return checkHost(host)
}

// checkHost accepts an IP address or a DNS name.
func checkHost(host string) error {
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if len(host) > 253 {
		return errors.New("host name longer than 253 characters")
	}
	for _, r := range host {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_') {
			return fmt.Errorf("host %q has a character (%q) not allowed in a host name or IP address", host, r)
		}
	}
	if strings.Trim(host, ".") == "" {
		return fmt.Errorf("host %q is not a host name", host)
	}
	return nil
}
