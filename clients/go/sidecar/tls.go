package sidecar

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"google.golang.org/grpc/credentials"
)

// tlsOptions is what the TLS options of Dial ask for.
type tlsOptions struct {
	enabled    bool
	caFile     string
	caGiven    bool // WithCAFile was given: an empty name is an error, not the system's roots
	certFile   string
	keyFile    string
	certGiven  bool // WithClientCert was given: empty names are an error, not no certificate
	serverName string
	config     *tls.Config
}

// WithTLS dials with TLS, for a TCP listener with a certificate
// ([[listen]] cert/key), verified with the system's roots unless WithCAFile.
func WithTLS() Option { return func(o *options) { o.tls.enabled = true } }

// WithCAFile verifies the sidecar's certificate with the CA certificates of
// this PEM file (a private CA) instead of the system's roots; implies WithTLS.
// An empty path fails Dial (an unset variable would otherwise trust every
// CA of the system's roots without a word).
func WithCAFile(path string) Option {
	return func(o *options) { o.tls.enabled, o.tls.caFile, o.tls.caGiven = true, path, true }
}

// WithClientCert presents this PEM certificate and key, which a listener with
// a client_ca requires (mTLS); implies WithTLS. Empty paths fail Dial.
func WithClientCert(certFile, keyFile string) Option {
	return func(o *options) {
		o.tls.enabled, o.tls.certFile, o.tls.keyFile, o.tls.certGiven = true, certFile, keyFile, true
	}
}

// WithServerName expects this name in the sidecar's certificate (default: the
// target's host); implies WithTLS.
func WithServerName(name string) Option {
	return func(o *options) { o.tls.enabled, o.tls.serverName = true, name }
}

// WithTLSConfig dials with this crypto/tls configuration; the other TLS
// options add to it (a copy).
func WithTLSConfig(cfg *tls.Config) Option {
	return func(o *options) { o.tls.enabled, o.tls.config = true, cfg }
}

// WithInsecure allows WithToken over a plain connection to a host that is not
// loopback: the token then travels in cleartext, readable by anyone on the
// path. Without it such a Dial fails (ErrCleartextToken).
func WithInsecure() Option { return func(o *options) { o.insecure = true } }

// ErrCleartextToken is returned by Dial for a token on a plain connection to
// a host that is not loopback, without WithInsecure.
var ErrCleartextToken = errors.New("refusing to send the bearer token in cleartext to another host " +
	"(use WithTLS or WithCAFile for a TLS listener, or WithInsecure to send it anyway)")

// ErrNoClientCert: the sidecar's listener asked for a client certificate (an
// mTLS listener, with a client_ca) and none was given (WithClientCert). It
// fails the TLS handshake; a call's error (UNAVAILABLE) carries its text.
var ErrNoClientCert = errors.New("the sidecar's listener requires a client certificate (mTLS): " +
	"give one with WithClientCert")

// transportCredentials builds the TLS credentials the options ask for.
func (t tlsOptions) transportCredentials() (credentials.TransportCredentials, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.config != nil {
		cfg = t.config.Clone()
	}
	if t.caGiven && t.caFile == "" {
		return nil, errors.New("sidecar: WithCAFile: an empty file name (give the CA's PEM file; " +
			"WithTLS alone verifies with the system's roots)")
	}
	if t.certGiven && t.certFile == "" && t.keyFile == "" {
		return nil, errors.New("sidecar: WithClientCert: empty file names (give the client certificate's " +
			"PEM file and its key's)")
	}
	if t.caFile != "" {
		pem, err := os.ReadFile(t.caFile)
		if err != nil {
			return nil, fmt.Errorf("sidecar: CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("sidecar: CA file %s: no PEM certificate in it", t.caFile)
		}
		cfg.RootCAs = pool
	}
	if (t.certFile == "") != (t.keyFile == "") {
		return nil, errors.New("sidecar: WithClientCert needs the certificate and its key")
	}
	if t.certFile != "" {
		pair, err := tls.LoadX509KeyPair(t.certFile, t.keyFile)
		if err != nil {
			return nil, fmt.Errorf("sidecar: client certificate: %w", err)
		}
		cfg.Certificates = append(cfg.Certificates, pair)
	}
	if t.serverName != "" {
		cfg.ServerName = t.serverName
	}
	// A listener asking for a client certificate gets one, or ErrNoClientCert;
	// one refusing it says ErrClientCertRefused (mtls.go).
	return newMTLSCredentials(cfg), nil
}

// IsLocalTarget reports whether target only reaches this machine: a Unix
// socket, or a TCP address whose host is localhost or a loopback IP.
func IsLocalTarget(target string) bool {
	if strings.HasPrefix(target, "unix:") || strings.HasPrefix(target, "unix-abstract:") {
		return true
	}
	for _, scheme := range []string{"dns:///", "dns:", "passthrough:///", "ipv4:", "ipv6:", "tcp:"} {
		if strings.HasPrefix(target, scheme) {
			target = strings.TrimPrefix(target, scheme)
			break
		}
	}
	host := target
	if i := strings.LastIndex(target, ":"); i >= 0 {
		host = target[:i]
	}
	host = strings.ToLower(strings.Trim(host, "[]"))
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
