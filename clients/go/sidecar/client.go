// Package sidecar is the Go client of agent-sidecar: a thin, idiomatic layer
// over the generated gRPC stubs in package agentsidecarv1.
//
//	c, err := sidecar.Dial(ctx, "unix:./data/sidecar.sock")
//	defer c.Close()
//	for f, err := range c.Prompt(ctx, sidecar.PromptParams{Source: src, Text: "hi"}) {
//		if err != nil { ... }           // typed *sidecar.Error; see IsReason
//		fmt.Print(f.GetTextDelta().GetText())
//	}
//
// Every call takes a context.Context. Every gRPC failure comes back as
// *Error (use errors.As or IsReason). Prompt and Watch return Go 1.23
// iterators (iter.Seq2[*Frame, error]) that survive a dropped connection by
// resuming with WatchActivity, without a gap or a duplicate frame.
package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"time"

	pb "github.com/agent-sidecar/agent-sidecar/clients/go/agentsidecarv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// Client is a connection to one sidecar. It is safe for concurrent use.
type Client struct {
	conn *grpc.ClientConn

	// Raw generated stubs, for RPCs this package does not wrap. Their errors
	// are converted to *Error too.
	Sessions pb.SessionServiceClient
	Prompts  pb.PromptServiceClient
	Tools    pb.ToolServiceClient

	resumeWindow time.Duration
	idleTimeout  time.Duration
	conns        *connSet
}

type options struct {
	idleTimeout  time.Duration
	keepalive    keepalive.ClientParameters
	token        string
	dialOpts     []grpc.DialOption
	resumeWindow time.Duration
	lazy         bool
	tls          tlsOptions
	insecure     bool
}

// Option configures Dial.
type Option func(*options)

// WithToken sends "authorization: Bearer <token>" with every call. Over a
// plain connection only to a Unix socket or a loopback address, unless
// WithInsecure: to another host use WithTLS (or WithCAFile). A token must be
// printable ASCII (a gRPC header value): Dial fails on any other character,
// such as the newline at the end of the file the token was read from.
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithDialOptions appends raw grpc.DialOptions (interceptors, other
// transport credentials, ...); they come after the options above.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

// WithResumeWindow sets how long Prompt and Watch keep trying to resume a
// dropped stream without receiving a frame (default 30s; 0 disables resume).
func WithResumeWindow(d time.Duration) Option { return func(o *options) { o.resumeWindow = d } }

// WithStreamIdleTimeout sets how long a Prompt or Watch stream may go without
// any frame, keepalive frames included (the sidecar sends one on a silent
// stream every keepalive_s, 15 s by default), before it is taken for a dropped
// connection: the client then closes its connections (a half-open one would
// take every new call too) and resumes. Default 45 s; 0 disables it.
func WithStreamIdleTimeout(d time.Duration) Option { return func(o *options) { o.idleTimeout = d } }

// WithKeepalive sets the connection's keepalive pings: one after time without
// activity, and the connection is closed when it is not answered within
// timeout (default 20 s and 10 s, with or without calls in flight). grpc-go
// pings at most every 10 s whatever time says.
func WithKeepalive(time, timeout time.Duration) Option {
	return func(o *options) { o.keepalive.Time, o.keepalive.Timeout = time, timeout }
}

// WithLazyConnect makes Dial return at once instead of waiting for the
// connection to become ready; the first call connects.
func WithLazyConnect() Option { return func(o *options) { o.lazy = true } }

// Dial connects to a sidecar at target, one of TargetForms (the same in every
// client of this repository): "unix:/path/to/sidecar.sock" (also
// "unix:relative/path" and "unix:///abs/path"), a bare socket path
// ("/abs/sidecar.sock", "./rel.sock"), "host:port", "[::1]:port",
// "tcp:host:port" (or "tcp://host:port") or "dns:///host:port". Any other
// target (no port, another scheme, no socket path, an out-of-range port, a
// malformed host) fails at once with ErrInvalidTarget. Unless WithLazyConnect is given it waits until the
// connection is ready or ctx ends, so pass a context with a timeout. An error
// for a connection not ready wraps ctx.Err() and, when grpc-go knows it, the
// last connection attempt's failure as an *Error (Unavailable: no such
// socket, connection refused, a certificate that failed verification...),
// fetched by one health check of at most half a second more.
func Dial(ctx context.Context, target string, opts ...Option) (*Client, error) {
	o := options{resumeWindow: 30 * time.Second, idleTimeout: 45 * time.Second,
		keepalive: keepalive.ClientParameters{Time: 20 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}}
	for _, opt := range opts {
		opt(&o)
	}
	given := target
	target, terr := normalizeTarget(target)
	if terr != nil {
		return nil, fmt.Errorf("sidecar: dial %q: %w: %v", given, ErrInvalidTarget, terr)
	}
	if i := strings.IndexFunc(o.token, func(r rune) bool { return r < 0x20 || r > 0x7e }); i >= 0 {
		// The value is not echoed: it is a secret.
		return nil, fmt.Errorf("sidecar: WithToken: the token has a character a gRPC header does not allow "+
			"at byte %d (only printable ASCII, 0x20-0x7E: no newline, control character or non-ASCII letter)", i)
	}
	// A plain TCP connection the peer closes at setup is explained (ErrClosedAtSetup).
	conns := &connSet{live: map[net.Conn]struct{}{}, plain: !o.tls.enabled}
	dialOpts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithKeepaliveParams(o.keepalive),
		grpc.WithContextDialer(conns.dial),
		grpc.WithChainUnaryInterceptor(unaryErrors),
		grpc.WithChainStreamInterceptor(streamErrors),
		grpc.WithDefaultServiceConfig(ServiceConfig), // retries of the idempotent reads
		// The sidecar is local: reconnect quickly after a restart.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 3 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
	if o.tls.enabled {
		creds, err := o.tls.transportCredentials()
		if err != nil {
			return nil, err
		}
		dialOpts = append(dialOpts, grpc.WithTransportCredentials(creds))
	}
	// A token that must not travel in cleartext: gRPC refuses it on a plain
	// connection, however the connection's credentials were given.
	requireTLS := !o.insecure && !IsLocalTarget(target)
	if o.token != "" {
		dialOpts = append(dialOpts, grpc.WithPerRPCCredentials(bearer{o.token, requireTLS}))
	}
	dialOpts = append(dialOpts, o.dialOpts...)
	conn, err := grpc.NewClient(target, dialOpts...)
	if err != nil && o.token != "" && requireTLS && strings.Contains(err.Error(), "transport level security") {
		return nil, fmt.Errorf("sidecar: dial %s: %w", target, ErrCleartextToken)
	}
	if err != nil {
		return nil, fmt.Errorf("sidecar: dial %s: %w", target, err)
	}
	c := &Client{
		conn:         conn,
		Sessions:     pb.NewSessionServiceClient(conn),
		Prompts:      pb.NewPromptServiceClient(conn),
		Tools:        pb.NewToolServiceClient(conn),
		resumeWindow: o.resumeWindow,
		idleTimeout:  o.idleTimeout,
		conns:        conns,
	}
	if o.lazy {
		return c, nil
	}
	conn.Connect()
	for {
		s := conn.GetState()
		if s == connectivity.Ready {
			return c, nil
		}
		if !conn.WaitForStateChange(ctx, s) {
			why := connectFailure(conn) // say why, not only "not ready"
			conn.Close()
			if why != nil {
				return nil, fmt.Errorf("sidecar: dial %s: not ready (%s): %w: %w", target, s, ctx.Err(), why)
			}
			return nil, fmt.Errorf("sidecar: dial %s: not ready (%s): %w", target, s, ctx.Err())
		}
	}
}

// Close closes the connection; streams in flight end.
func (c *Client) Close() error { return c.conn.Close() }

// closed reports whether the connection was closed (by Close or through
// Conn().Close()): grpc-go then fails every call CANCELLED, which is no
// dropped connection to resume over. ClientConn.Close enters the Shutdown
// state before it fails the calls in flight.
func (c *Client) closed() bool {
	return c.conn != nil && c.conn.GetState() == connectivity.Shutdown
}

// Conn returns the underlying grpc.ClientConn (for health checks and the like).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// bearer is the token as PerRPCCredentials; it requires transport security
// (TLS) unless the target is local or WithInsecure was given.
type bearer struct {
	token      string
	requireTLS bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.requireTLS }

// DefaultCallTimeout is the deadline of a unary call whose context has none
// (as in the Python and Node clients); 0: none. Its passing fails the call
// DEADLINE_EXCEEDED without a reason (errors.Is(err, context.DeadlineExceeded)).
var DefaultCallTimeout = 30 * time.Second

// unaryErrors converts unary call failures to *Error. A request that cannot
// be encoded because a string is not valid UTF-8 fails INVALID_ARGUMENT
// naming the field, before anything is sent.
func unaryErrors(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if _, ok := ctx.Deadline(); !ok && DefaultCallTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultCallTimeout)
		defer cancel()
	}
	err := invoker(ctx, method, req, reply, cc, opts...)
	if status.Code(err) == codes.Internal {
		if uerr := checkUTF8(req); uerr != nil {
			return uerr
		}
	}
	return convertError(ctx, err)
}

// streamErrors converts stream failures (other than io.EOF) to *Error. It
// marks the failures raised on this side before anything was sent (invalid
// metadata such as an unprintable token, a message that cannot be encoded),
// so that Prompt, Watch and ToolHost do not mistake them for a dropped
// connection: opening a stream fails INTERNAL only for those (a reset stream
// shows up later, in RecvMsg), and SendMsg returns io.EOF for a broken
// stream, any other error being local.
func streamErrors(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
	streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		if status.Code(err) == codes.Internal {
			return nil, localError(ctx, err)
		}
		return nil, convertError(ctx, err)
	}
	return &errStream{ClientStream: s, ctx: ctx}, nil
}

type errStream struct {
	grpc.ClientStream
	ctx context.Context
}

func (s *errStream) RecvMsg(m any) error { return convertError(s.ctx, s.ClientStream.RecvMsg(m)) }

func (s *errStream) SendMsg(m any) error {
	err := s.ClientStream.SendMsg(m)
	if err == nil || errors.Is(err, io.EOF) { // io.EOF: the stream broke, RecvMsg says why
		return err
	}
	if uerr := checkUTF8(m); uerr != nil {
		return uerr
	}
	return localError(s.ctx, err)
}

// localError converts err and marks it raised on this side: never resumed.
func localError(ctx context.Context, err error) error {
	e, ok := FromError(convertError(ctx, err))
	if !ok {
		return err
	}
	l := *e
	l.local = true
	return &l
}

// connSet dials the client's connections and keeps them, so that a stream that
// went silent on a half-open connection (idle timeout) can close them: grpc-go
// would otherwise put the resumed call on the same dead connection until
// keepalive pings close it. Each close starts a new generation: a stream closes
// only the connections of the generation it opened its call in, so that a
// stream whose idle timer fires just after another stream's close does not
// kill the fresh connection the others have just resumed on (as the Python and
// Node clients replace a silent channel only once).
type connSet struct {
	mu    sync.Mutex
	gen   uint64
	live  map[net.Conn]struct{}
	plain bool // no TLS of this package's: a TCP connection closed at setup says ErrClosedAtSetup
}

// dial is grpc-go's context dialer: "unix://ABS", "unix:REL" (as grpc-go
// passes a unix target to a custom dialer) or host:port.
func (s *connSet) dial(ctx context.Context, addr string) (net.Conn, error) {
	network, address := "tcp", addr
	switch {
	case strings.HasPrefix(addr, "unix://"):
		network, address = "unix", strings.TrimPrefix(addr, "unix://")
	case strings.HasPrefix(addr, "unix:"):
		network, address = "unix", strings.TrimPrefix(addr, "unix:")
	case strings.HasPrefix(addr, "\x00"), filepath.IsAbs(addr):
		network = "unix"
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	if s.plain && network == "tcp" {
		conn = newSetupConn(conn, func(err error) error { return fmt.Errorf("%w (%w)", ErrClosedAtSetup, err) })
	}
	s.mu.Lock()
	s.live[conn] = struct{}{}
	s.mu.Unlock()
	return &trackedConn{Conn: conn, set: s}, nil
}

// generation is the current generation: read it before opening a call.
func (s *connSet) generation() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// closeGen closes every connection (their calls fail UNAVAILABLE and resume,
// or re-register) and starts a new generation, unless a close already ended
// generation gen: then the connections are newer than the stream that asks,
// and it reports false.
func (s *connSet) closeGen(gen uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != s.gen {
		return false
	}
	s.gen++
	for c := range s.live {
		c.Close()
	}
	clear(s.live)
	return true
}

type trackedConn struct {
	net.Conn
	set *connSet
}

func (c *trackedConn) Close() error {
	c.set.mu.Lock()
	delete(c.set.live, c.Conn)
	c.set.mu.Unlock()
	return c.Conn.Close()
}
