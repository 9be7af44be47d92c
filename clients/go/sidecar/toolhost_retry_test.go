package sidecar

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"log"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "github.com/agent-sidecar/agent-sidecar/clients/go/agentsidecarv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
)

// A ToolHost that cannot reach its sidecar: it retries a refused connection,
// saying so, and stops on a TLS failure.

// A ToolHost whose sidecar is not there (not started yet, or a wrong port)
// keeps trying, as an adapter started first must, and says so: OnRetry gets
// every failed attempt with its error. The client's resume window is for
// Prompt and Watch streams: with resuming off (WithResumeWindow(0)) the host
// still waits; it returned the first failure, and stopped at a sidecar's restart.
func TestToolHostReportsEachRetry(t *testing.T) {
	for _, opts := range [][]Option{{}, {WithResumeWindow(0)}} {
		toolHostReportsEachRetry(t, opts...)
	}
}

func toolHostReportsEachRetry(t *testing.T, opts ...Option) {
	target := "unix:" + filepath.Join(t.TempDir(), "nobody.sock")
	c, err := Dial(context.Background(), target, append(opts, WithLazyConnect())...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	type retry struct {
		attempt int
		err     error
	}
	retries := make(chan retry, 100)
	host := NewToolHost("t")
	host.OnRetry = func(attempt int, err error) { retries <- retry{attempt, err} }
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- host.Serve(ctx, c) }()
	for want := 1; want <= 2; want++ {
		var r retry
		select {
		case r = <-retries:
		case err := <-served:
			t.Fatalf("Serve returned before retry %d: %v", want, err)
		}
		var e *Error
		if r.attempt != want || !errors.As(r.err, &e) || e.Code != codes.Unavailable {
			t.Fatalf("retry %d: attempt %d, err %v", want, r.attempt, r.err)
		}
	}
	stop()
	if err := <-served; err != nil {
		t.Fatalf("Serve = %v", err)
	}
}

// lineWriter hands each log line to a channel.
type lineWriter chan string

func (w lineWriter) Write(p []byte) (int, error) { w <- string(p); return len(p), nil }

// Without OnRetry the host logs its first failed attempt, with the error.
func TestToolHostLogsTheFirstRetry(t *testing.T) {
	lines := make(lineWriter, 100)
	log.SetOutput(lines)
	defer log.SetOutput(os.Stderr)
	target := "unix:" + filepath.Join(t.TempDir(), "nobody.sock")
	c, err := Dial(context.Background(), target, WithLazyConnect())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- NewToolHost("quiet").Serve(ctx, c) }()
	line := <-lines
	stop()
	<-served
	if !strings.Contains(line, `ToolHost "quiet"`) || !strings.Contains(line, "attempt 1") || !strings.Contains(line, "nobody.sock") {
		t.Fatalf("log line %q", line)
	}
}

// A TLS failure is no sidecar still starting: a CA that did not sign its
// certificate, or no client certificate for an mTLS listener, ends Serve with
// the error (Ready() closes, Err() says why) instead of retrying for good.
func TestToolHostEndsOnTLSFailure(t *testing.T) {
	dir := t.TempDir()
	ca, caKey, caFile := makeCA(t, dir, "ca")
	_, _, wrongCA := makeCA(t, dir, "wrong")
	serverCert := makeLeaf(t, ca, caKey)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	listen := func(cfg *tls.Config) string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
		pb.RegisterToolServiceServer(srv, &stallTools{registered: make(chan int, 8), results: make(chan string, 8)})
		go srv.Serve(l)
		t.Cleanup(srv.Stop)
		return l.Addr().String()
	}
	tlsAddr := listen(&tls.Config{Certificates: []tls.Certificate{serverCert}})
	mtlsAddr := listen(&tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert})
	for name, dial := range map[string]struct {
		addr string
		opts []Option
	}{
		"wrong CA":              {tlsAddr, []Option{WithCAFile(wrongCA)}},
		"no client certificate": {mtlsAddr, []Option{WithCAFile(caFile)}},
	} {
		c, err := Dial(context.Background(), dial.addr, append(dial.opts, WithLazyConnect())...)
		if err != nil {
			t.Fatal(err)
		}
		host := NewToolHost("t")
		retried := 0
		host.OnRetry = func(_ int, err error) { retried++; t.Logf("%s: retry after %v", name, err) }
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err = host.Serve(ctx, c)
		<-host.Ready()
		var e *Error
		if !errors.As(err, &e) || e.Code != codes.Unavailable || ctx.Err() != nil || host.Err() == nil || retried != 0 {
			t.Errorf("%s: Serve = %v (ctx %v, Err %v, retried %d)", name, err, ctx.Err(), host.Err(), retried)
		}
		cancel()
		c.Close()
	}
	// The right CA: the same host registers.
	c, err := Dial(context.Background(), tlsAddr, WithCAFile(caFile), WithLazyConnect())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	host := NewToolHost("t")
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- host.Serve(ctx, c) }()
	<-host.Ready()
	if err := host.Err(); err != nil {
		t.Fatalf("right CA: %v", err)
	}
	cancel()
	<-served
}

func makeCA(t *testing.T, dir, name string) (*x509.Certificate, *ecdsa.PrivateKey, string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	path := filepath.Join(dir, name+".pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key, path
}

func makeLeaf(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	cert, err := tls.X509KeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// A peer that accepts and closes every connection (a proxy whose sidecar is
// down, as Docker's port forwarding does) is an outage: the host retries it.
// Over TLS grpc-go words it "authentication handshake failed: EOF", which the
// host took for a TLS failure and stopped with, for good.
func TestToolHostRetriesAConnectionClosedInTheHandshake(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	_, _, caFile := makeCA(t, t.TempDir(), "ca")
	c, err := Dial(context.Background(), l.Addr().String(), WithCAFile(caFile), WithLazyConnect())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	host := NewToolHost("t")
	retries := make(chan error, 100)
	host.OnRetry = func(_ int, err error) { retries <- err }
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- host.Serve(ctx, c) }()
	select {
	case err := <-retries:
		t.Logf("retried after %v", err)
	case err := <-served:
		t.Fatalf("Serve = %v: it stopped instead of retrying", err)
	}
	cancel()
	<-served
}
