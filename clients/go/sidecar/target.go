package sidecar

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// TargetForms are the targets every client of this repository accepts.
const TargetForms = "unix:PATH, unix:///ABS/PATH, a bare socket path (/abs, ./rel, ../rel), HOST:PORT, " +
	"[IPV6]:PORT, tcp:HOST:PORT (or tcp://HOST:PORT), dns:[//AUTHORITY/]HOST:PORT"

// normalizeTarget checks target against TargetForms and turns it into
// grpc-go's form: a bare socket path gets "unix:", "tcp:" (and "tcp://") is
// dropped, and the authority of "unix://AUTHORITY/PATH" (which grpc-go's unix
// resolver refuses) too. It reads the forms exactly as the Python client does
// (clients/python/src/agent_sidecar_client/_args.py, normalize_target), so the
// clients accept and refuse the same targets (the conformance scenario
// target_forms).
func normalizeTarget(target string) (string, error) {
	t := target
	if strings.TrimSpace(t) == "" {
		return "", errors.New("empty target")
	}
	if t != strings.TrimSpace(t) {
		return "", errors.New("leading or trailing whitespace")
	}
	if strings.HasPrefix(t, "/") || strings.HasPrefix(t, "./") || strings.HasPrefix(t, "../") {
		t = "unix:" + t
	}
	scheme, rest, sep := strings.Cut(t, ":")
	switch {
	case sep && (scheme == "unix" || scheme == "unix-abstract"):
		if strings.HasPrefix(rest, "//") { // unix://[authority]/path: the path keeps its "/"
			slash := strings.Index(rest[2:], "/")
			if slash < 0 {
				rest = ""
			} else {
				rest = rest[2+slash:]
			}
			t = scheme + "://" + rest // grpc-go's resolvers take no authority
		}
		path, _, _ := strings.Cut(rest, "?")
		path, _, _ = strings.Cut(path, "#")
		if path == "" || path == "/" {
			return "", errors.New("no socket path after " + scheme + ":")
		}
		if n := len(unescapeLenient(path)); n > unixPathMax {
			return "", fmt.Errorf("a Unix socket path may be at most %d bytes; this one is %d", unixPathMax, n)
		}
		if fi, err := os.Stat(unescapeLenient(path)); scheme == "unix" && err == nil && fi.IsDir() {
			return "", fmt.Errorf("%s is a directory, not a socket", path)
		}
		return t, nil
	case sep && scheme == "tcp":
		addr := strings.TrimPrefix(rest, "//")
		return addr, checkAddr(addr)
	case sep && scheme == "dns":
		addr := rest
		if strings.HasPrefix(addr, "//") {
			if slash := strings.Index(addr[2:], "/"); slash < 0 {
				addr = ""
			} else {
				addr = addr[2+slash+1:]
			}
		}
		return t, checkAddr(addr)
	}
	if sep && (strings.EqualFold(scheme, "ipv4") || strings.EqualFold(scheme, "ipv6")) {
		// gRPC's own scheme: read as the host "ipv4", it was told of brackets.
		return "", fmt.Errorf("gRPC's %s: scheme, which this client does not dial: give the address alone "+
			"(host:port, [v6]:port)", scheme)
	}
	if strings.Contains(t, "://") || (sep && !(rest != "" && rest[0] >= '0' && rest[0] <= '9') && !strings.HasPrefix(t, "[")) {
		return "", fmt.Errorf("a scheme this client does not dial (%s)", TargetForms)
	}
	return t, checkAddr(t) // gRPC reads it as dns:///target
}

// unescapeLenient decodes %XX escapes as gRPC's resolvers do, leaving a '%'
// that starts no escape as it is.
func unescapeLenient(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			v, _ := strconv.ParseUint(s[i+1:i+3], 16, 8)
			b.WriteByte(byte(v))
			i += 2
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// ErrInvalidTarget is wrapped by the error of Dial for a target that cannot
// be dialled however long one waits ("host:", ":99999", "unix:", ...).
var ErrInvalidTarget = errors.New("invalid target")

// unixPathMax is the longest Unix socket path in bytes: a sockaddr_un's
// 108-byte sun_path less its terminating NUL (an abstract name's leading NUL
// takes that byte). The sidecar refuses to listen on a longer path and gRPC's
// C-core refuses to dial one, so a longer path can never reach a sidecar.
const unixPathMax = 107

// checkAddr checks host:port or [ipv6]:port: a host and a port are always
// given, the port 1-65535 in ASCII digits only (no sign), the host a name of
// letters, digits, '-', '.' and '_' or an IPv4 address; an IPv6 address goes
// in brackets (and only an IPv6 address).
func checkAddr(addr string) error {
	var port string
	if rest, ok := strings.CutPrefix(addr, "["); ok {
		h, p, closed := strings.Cut(rest, "]")
		if !closed || !strings.HasPrefix(p, ":") {
			return errors.New("not [ipv6]:port")
		}
		if a, err := netip.ParseAddr(h); err != nil || !a.Is6() {
			return fmt.Errorf("%q is no IPv6 address", h)
		}
		port = p[1:]
	} else {
		i := strings.LastIndex(addr, ":")
		if i < 0 {
			return errors.New("no port (want host:port)")
		}
		host := addr[:i]
		port = addr[i+1:]
		if strings.Contains(host, ":") {
			return errors.New("not host:port (an IPv6 address goes in brackets: [::1]:50051)")
		}
		if err := checkHost(host); err != nil {
			return err
		}
	}
	n, err := strconv.Atoi(port)
	if port == "" || strings.Trim(port, "0123456789") != "" || err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}

// checkHost accepts a host name or an IPv4 address (letters, digits, '-', '.', '_').
func checkHost(host string) error {
	if host == "" {
		return errors.New("no host (want host:port)")
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
