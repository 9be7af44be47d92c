package sidecar

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"google.golang.org/grpc/credentials"
)

// ErrClientCertRefused: the sidecar's listener asked for a client certificate
// (an mTLS listener, with a client_ca), was given one (WithClientCert), and
// closed the connection without a word, which is how it refuses a certificate
// its client_ca did not sign. Under TLS 1.3 the client's side of the handshake
// is over by then, so grpc-go only saw the connection end ("error reading
// server preface: EOF", "broken pipe"); a call's error (UNAVAILABLE) carries
// this text instead, with that cause after it.
var ErrClientCertRefused = errors.New("the sidecar's listener refused the TLS handshake: it asked for a client " +
	"certificate (mTLS) and closed the connection on the one given, as it does on one its client_ca did not " +
	"sign: check WithClientCert")

// mtlsCredentials are grpc-go's TLS credentials of cfg, which tell a listener
// refusing the client certificate (ErrClientCertRefused) from a connection
// that merely ends, and fail the handshake of a listener that asks for a
// certificate when none was given (ErrNoClientCert).
type mtlsCredentials struct {
	credentials.TransportCredentials // credentials.NewTLS(cfg): Info (the server name), ServerHandshake
	cfg                              *tls.Config
}

func newMTLSCredentials(cfg *tls.Config) credentials.TransportCredentials {
	return &mtlsCredentials{credentials.NewTLS(cfg), cfg}
}

// ClientHandshake runs grpc-go's TLS handshake with a configuration of this
// connection's own, whose certificate callback notes that the listener asked
// for one. A listener that asked, and then ends the connection before its
// first byte (in the handshake under TLS 1.2, after it under TLS 1.3), refused
// the certificate: the error says so.
//
// A listener that accepted the certificate sends its session tickets at once
// (a sidecar does, after the client's Finished, before its first frame): a
// connection that ends after one arrived was not refused (a sidecar killed
// between the handshake and its first frame), and its error stays its own.
func (m *mtlsCredentials) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	cfg := m.cfg.Clone()
	asked := new(atomic.Bool)
	cfg.GetClientCertificate = clientCertificate(m.cfg, asked)
	tickets := &ticketWatch{base: m.cfg.ClientSessionCache}
	if !cfg.SessionTicketsDisabled {
		cfg.ClientSessionCache = tickets
	}
	refused := func(err error) error {
		if tickets.got.Load() {
			return err
		}
		return fmt.Errorf("%w (%w)", ErrClientCertRefused, err)
	}
	conn, info, err := credentials.NewTLS(cfg).ClientHandshake(ctx, authority, raw)
	switch {
	case err != nil && asked.Load() && closedByPeer(err):
		return nil, nil, refused(err)
	case err != nil || !asked.Load():
		return conn, info, err
	}
	return newSetupConn(conn, refused), info, nil
}

// ticketWatch is the session cache of one connection: it notes that the
// listener sent a session ticket (a TLS 1.3 listener sends it only once it
// has accepted the handshake, the client certificate included), and passes
// everything on to the configuration's own cache, if any.
type ticketWatch struct {
	base tls.ClientSessionCache
	got  atomic.Bool
}

func (w *ticketWatch) Get(key string) (*tls.ClientSessionState, bool) {
	if w.base == nil {
		return nil, false
	}
	return w.base.Get(key)
}

func (w *ticketWatch) Put(key string, cs *tls.ClientSessionState) {
	if cs != nil {
		w.got.Store(true)
	}
	if w.base != nil {
		w.base.Put(key, cs)
	}
}

// Clone copies the credentials (grpc-go clones them per ClientConn).
func (m *mtlsCredentials) Clone() credentials.TransportCredentials {
	return newMTLSCredentials(m.cfg.Clone())
}

// clientCertificate answers a listener's certificate request as crypto/tls
// would from base (its GetClientCertificate, else the first of its
// Certificates the request supports, else none), noting in asked that it
// came; with no certificate at all it fails the handshake with
// ErrNoClientCert: a sidecar asks only on an mTLS listener, which requires
// one, and without this TLS 1.3 completes the client's handshake and the
// refusal comes later, as a bare "broken pipe".
func clientCertificate(base *tls.Config, asked *atomic.Bool) func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
		asked.Store(true)
		if base.GetClientCertificate != nil {
			return base.GetClientCertificate(cri)
		}
		if len(base.Certificates) == 0 {
			return nil, ErrNoClientCert
		}
		for i := range base.Certificates {
			if cri.SupportsCertificate(&base.Certificates[i]) == nil {
				return &base.Certificates[i], nil
			}
		}
		return new(tls.Certificate), nil
	}
}
