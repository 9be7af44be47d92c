package sidecar

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// The TLS options and the cleartext rule (no server needed: the refusal comes
// before any connection). TLS and mTLS against a real sidecar run in the
// conformance suite (scenarios tls_custom_ca and mtls_client_cert).

var remoteTargets = []string{"10.1.2.3:50051", "sidecar.internal:50051", "0.0.0.0:50051",
	"dns:///sidecar.internal:50051", "[2001:db8::1]:50051"}
var localTargets = []string{"unix:./data/sidecar.sock", "unix:///run/s.sock", "127.0.0.1:50051",
	"127.8.9.10:1", "localhost:50051", "[::1]:50051", "tcp:127.0.0.1:1"}

func dialLazy(t *testing.T, target string, opts ...Option) error {
	t.Helper()
	c, err := Dial(context.Background(), target, append(opts, WithLazyConnect())...)
	if err == nil {
		c.Close()
	}
	return err
}

func TestTokenRefusedOnPlainConnectionToAnotherHost(t *testing.T) {
	for _, target := range remoteTargets {
		if IsLocalTarget(target) {
			t.Errorf("%s: counted as local", target)
		}
		if err := dialLazy(t, target, WithToken("t")); !errors.Is(err, ErrCleartextToken) {
			t.Errorf("%s: want ErrCleartextToken, got %v", target, err)
		}
		for _, ok := range [][]Option{{WithToken("t"), WithInsecure()}, {WithToken("t"), WithTLS()}, {}} {
			if err := dialLazy(t, target, ok...); err != nil {
				t.Errorf("%s: %v", target, err)
			}
		}
	}
}

func TestTokenMayGoPlainWhereNothingLeavesTheMachine(t *testing.T) {
	for _, target := range localTargets {
		if !IsLocalTarget(target) {
			t.Errorf("%s: not counted as local", target)
		}
		if err := dialLazy(t, target, WithToken("t")); err != nil {
			t.Errorf("%s: %v", target, err)
		}
	}
}

func TestTLSFilesMustLoad(t *testing.T) {
	if err := dialLazy(t, "127.0.0.1:1", WithCAFile("/no/such/ca.pem")); err == nil ||
		!strings.Contains(err.Error(), "CA file") {
		t.Errorf("missing CA file: %v", err)
	}
	if err := dialLazy(t, "127.0.0.1:1", WithClientCert("/no/client.pem", "")); err == nil ||
		!strings.Contains(err.Error(), "certificate and its key") {
		t.Errorf("a certificate without its key: %v", err)
	}
	// Empty names (an unset variable): before, WithCAFile("") verified with the
	// system's roots and WithClientCert("", "") presented no certificate, silently.
	if err := dialLazy(t, "127.0.0.1:1", WithCAFile("")); err == nil ||
		!strings.Contains(err.Error(), "WithCAFile: an empty file name") {
		t.Errorf("an empty CA file name: %v", err)
	}
	if err := dialLazy(t, "127.0.0.1:1", WithClientCert("", "")); err == nil ||
		!strings.Contains(err.Error(), "WithClientCert: empty file names") {
		t.Errorf("empty client certificate names: %v", err)
	}
}
