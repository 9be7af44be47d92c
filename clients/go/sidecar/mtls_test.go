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
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// issue makes a certificate of template signed by parent (self-signed when
// parent is nil) and returns it with its key.
func issue(t *testing.T, template *x509.Certificate, parent *tls.Certificate) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template.SerialNumber = big.NewInt(time.Now().UnixNano())
	template.NotBefore, template.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	signer, signerKey := template, any(key)
	if parent != nil {
		signer, signerKey = parent.Leaf, parent.PrivateKey
	}
	der, err := x509.CreateCertificate(rand.Reader, template, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

// writePEM writes cert (and its key, when keyFile is not "") as PEM files in dir.
func writePEM(t *testing.T, dir, certFile, keyFile string, cert tls.Certificate) {
	t.Helper()
	out := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})
	if err := os.WriteFile(filepath.Join(dir, certFile), out, 0o600); err != nil {
		t.Fatal(err)
	}
	if keyFile != "" {
		der, err := x509.MarshalECPrivateKey(cert.PrivateKey.(*ecdsa.PrivateKey))
		if err != nil {
			t.Fatal(err)
		}
		out = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
		if err := os.WriteFile(filepath.Join(dir, keyFile), out, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// mtlsListener serves TLS 1.3 on 127.0.0.1, asking for a client certificate;
// after each handshake, whatever its outcome, it closes the connection
// without a byte of HTTP/2. It returns its address and the Dial options of
// a client with a CA that trusts it and a client certificate.
func mtlsListener(t *testing.T, cfg *tls.Config) (string, []Option) {
	t.Helper()
	dir := t.TempDir()
	ca := issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}, nil)
	server := issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "sidecar"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, &ca)
	client := issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "client"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, &ca)
	writePEM(t, dir, "ca.pem", "", ca)
	writePEM(t, dir, "client.pem", "client.key", client)
	cfg.Certificates, cfg.MinVersion, cfg.NextProtos = []tls.Certificate{server}, tls.VersionTLS13, []string{"h2"}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			raw, err := l.Accept()
			if err != nil {
				return
			}
			conn := tls.Server(raw, cfg)
			conn.Handshake()
			conn.Close()
		}
	}()
	return l.Addr().String(), []Option{WithCAFile(filepath.Join(dir, "ca.pem")),
		WithClientCert(filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.key")), WithLazyConnect()}
}

// callError is the error of one call through a client dialled with opts.
func callError(t *testing.T, target string, opts []Option) error {
	t.Helper()
	c, err := Dial(context.Background(), target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = c.GetSession(ctx, "agent:main:p:dm:c")
	if err == nil {
		t.Fatal("the call went through")
	}
	return err
}

// A listener that accepted the client certificate (it sent its session
// tickets) and then closed the connection before its first frame is a
// sidecar that died there, not one refusing the certificate: the error is
// the connection's own. Before, it read ErrClientCertRefused ("check
// WithClientCert"). A listener refusing the certificate still gets the hint.
func TestClientCertRefusedOnlyWhenTheListenerRefusedIt(t *testing.T) {
	target, opts := mtlsListener(t, &tls.Config{ClientAuth: tls.RequireAnyClientCert})
	if err := callError(t, target, opts); strings.Contains(err.Error(), ErrClientCertRefused.Error()) {
		t.Errorf("a connection that ended after the handshake was accepted reads as a refusal: %v", err)
	}
	target, opts = mtlsListener(t, &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs: x509.NewCertPool()}) // trusts no client
	if err := callError(t, target, opts); !strings.Contains(err.Error(), ErrClientCertRefused.Error()) {
		t.Errorf("a refused certificate is not named: %v", err)
	}
}
