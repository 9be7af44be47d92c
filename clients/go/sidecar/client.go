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
	"strings"
	"time"

	pb "github.com/agent-sidecar/agent-sidecar/clients/go/agentsidecarv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
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
}

type options struct {
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

// WithLazyConnect makes Dial return at once instead of waiting for the
// connection to become ready; the first call connects.
func WithLazyConnect() Option { return func(o *options) { o.lazy = true } }

// Dial connects to a sidecar at target, either "unix:/path/to/sidecar.sock"
// (also "unix:relative/path" and "unix:///abs/path") or "host:port" (also
// "tcp:host:port", "dns:///host:port"). A target that cannot be dialled (no
// socket path, an empty or out-of-range port, a malformed host) fails at once
// with ErrInvalidTarget. Unless WithLazyConnect is given it waits until the
// connection is ready or ctx ends, so pass a context with a timeout.
func Dial(ctx context.Context, target string, opts ...Option) (*Client, error) {
	o := options{resumeWindow: 30 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	given, terr := target, error(nil)
	if addr, ok := strings.CutPrefix(target, "tcp:"); ok { // tolerate an explicit tcp: scheme
		target = strings.TrimPrefix(addr, "//")
		terr = checkAddr(target)
	} else {
		terr = checkTarget(target)
	}
	if terr != nil {
		return nil, fmt.Errorf("sidecar: dial %q: %w: %v", given, ErrInvalidTarget, terr)
	}
	if i := strings.IndexFunc(o.token, func(r rune) bool { return r < 0x20 || r > 0x7e }); i >= 0 {
		// The value is not echoed: it is a secret.
		return nil, fmt.Errorf("sidecar: WithToken: the token has a character a gRPC header does not allow "+
			"at byte %d (only printable ASCII, 0x20-0x7E: no newline, control character or non-ASCII letter)", i)
	}
	dialOpts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
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
			conn.Close()
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

// unaryErrors converts unary call failures to *Error. A request that cannot
// be encoded because a string is not valid UTF-8 fails INVALID_ARGUMENT
// naming the field, before anything is sent.
func unaryErrors(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
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
