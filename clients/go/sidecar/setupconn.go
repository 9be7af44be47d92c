package sidecar

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrClosedAtSetup: a plain TCP connection ended before the sidecar's first
// byte (grpc-go: "error reading server preface: EOF"). A TLS listener closes
// a client without TLS so, and a proxy whose sidecar is down (Docker's port
// forwarding, say) every connection: a call's error (UNAVAILABLE) carries this
// text, with what grpc-go saw after it. A ToolHost retries it (the proxy).
var ErrClosedAtSetup = errors.New("the connection was closed before the sidecar's first byte: a TLS listener " +
	"closes a client without TLS so (use WithTLS or WithCAFile), and a proxy whose sidecar is down every connection")

// setupConn is a connection whose end before the sidecar's first byte means
// more than the bare error says (an mTLS listener refusing the client
// certificate, a TLS listener refusing a plain client). Until that byte
// arrives, the peer ending it (EOF, a reset, a broken pipe, a TLS alert)
// makes Read and Write fail with why(what they saw); after it, their errors
// are the connection's own.
//
// A write can fail on the peer's close before the reader (grpc-go's, which
// reads from the start) has taken in what the peer sent before it (an mTLS
// listener's session tickets: it had accepted the certificate). So a write
// failing so waits, at most readSettle, for the reader's own end, and why
// is asked only then.
type setupConn struct {
	net.Conn
	why       func(error) error
	answered  atomic.Bool
	readEnded chan struct{} // closed when a Read fails
	endOnce   sync.Once
}

// readSettle bounds a failed write's wait for the reader (setupConn).
const readSettle = time.Second

func newSetupConn(conn net.Conn, why func(error) error) *setupConn {
	return &setupConn{Conn: conn, why: why, readEnded: make(chan struct{})}
}

func (c *setupConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.answered.Store(true)
	}
	if err != nil {
		defer c.endOnce.Do(func() { close(c.readEnded) })
	}
	return n, c.explain(err)
}

func (c *setupConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil && !c.answered.Load() && closedByPeer(err) {
		select {
		case <-c.readEnded:
		case <-time.After(readSettle):
		}
	}
	return n, c.explain(err)
}

func (c *setupConn) explain(err error) error {
	if err == nil || c.answered.Load() || !closedByPeer(err) {
		return err
	}
	return c.why(err)
}

// closedByPeer reports whether err is the peer ending the connection: EOF, a
// reset, a broken pipe, or a TLS alert it sent ("remote error: tls: ...").
func closedByPeer(err error) bool {
	var op *net.OpError
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.As(err, &op) && op.Op == "remote error"
}
