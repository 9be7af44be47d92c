package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode"

	"github.com/agent-sidecar/agent-sidecar/clients/go/sidecar"
	"google.golang.org/grpc/codes"
)

// tlsArgs are the TLS scenarios' listeners and PEM files
// (clients/conformance/README.md).
type tlsArgs struct {
	tls, mtls, ca, wrongCA, clientCert, clientKey, foreignCert, foreignKey string
}

// tlsSession returns the scenario source's session id over a TLS listener.
// The connection is lazy, so a refused handshake fails the call at once.
func tlsSession(ctx context.Context, r *runner, sc *scenario, target string, opts ...sidecar.Option) (string, error) {
	src, err := sc.source()
	if err != nil {
		return "", err
	}
	c, err := sidecar.Dial(ctx, target, append(opts, sidecar.WithToken(r.token), sidecar.WithLazyConnect())...)
	if err != nil {
		return "", err
	}
	defer c.Close()
	s, err := c.GetOrCreateSession(ctx, src)
	if err != nil {
		return "", err
	}
	return s.GetSessionId(), nil
}

// tlsRefused checks that the listener refuses a client with these options:
// the call fails with the gRPC code named want (e.g. UNAVAILABLE), its text
// matching the regular expression matches (case-insensitive).
func tlsRefused(ctx context.Context, r *runner, sc *scenario, target, want, matches string, opts ...sidecar.Option) error {
	_, err := tlsSession(ctx, r, sc, target, opts...)
	if err == nil {
		return fmt.Errorf("%s accepted the client", target)
	}
	var se *sidecar.Error
	if !errors.As(err, &se) {
		return fmt.Errorf("error is not a *sidecar.Error: %T %v", err, err)
	}
	if got := codeName(se.Code); got != want {
		return fmt.Errorf("refused with %s, want %s: %v", got, want, err)
	}
	return errorMatches(err, matches)
}

// errorMatches checks err's text against the regular expression pattern, case-insensitively.
func errorMatches(err error, pattern string) error {
	re, cerr := regexp.Compile("(?i)" + pattern)
	if cerr != nil {
		return cerr
	}
	if !re.MatchString(err.Error()) {
		return fmt.Errorf("error does not match /%s/i: %v", pattern, err)
	}
	return nil
}

// connectFailureReason: Dial waits within_ms for the connection; its error
// says why there is none.
func connectFailureReason(ctx context.Context, r *runner, sc *scenario) error {
	a := r.tlsArgs
	if a.tls == "" || a.mtls == "" {
		return errors.New("no --tls or --mtls target given")
	}
	nobody := r.unixTarget[:strings.LastIndex(r.unixTarget, "/")+1] + "nobody.sock"
	cases := []struct {
		target, matches string
		opts            []sidecar.Option
	}{
		{nobody, sc.Expect.MissingSocketMatches, nil},
		{a.tls, sc.Expect.WrongCAMatches, []sidecar.Option{sidecar.WithCAFile(a.wrongCA)}},
		{a.mtls, sc.Expect.WithoutClientCertMatches, []sidecar.Option{sidecar.WithCAFile(a.ca)}},
		{a.tls, sc.Expect.PlainOnTLSMatches, nil},
	}
	for _, c := range cases {
		wait, cancel := context.WithTimeout(ctx, time.Duration(sc.WithinMS)*time.Millisecond)
		client, err := sidecar.Dial(wait, c.target, append(c.opts, sidecar.WithToken(r.token))...)
		cancel()
		if err == nil {
			client.Close()
			return fmt.Errorf("%s: connected", c.target)
		}
		if err := errorMatches(err, c.matches); err != nil {
			return fmt.Errorf("%s: %w", c.target, err)
		}
	}
	return nil
}

// sameSession checks the scenario source's session over TLS is the Unix socket's.
func sameSession(ctx context.Context, r *runner, sc *scenario, target string, opts ...sidecar.Option) error {
	src, err := sc.source()
	if err != nil {
		return err
	}
	uc, err := r.unixClient(ctx)
	if err != nil {
		return err
	}
	viaUnix, err := uc.GetOrCreateSession(ctx, src)
	if err != nil {
		return fmt.Errorf("unix: %w", err)
	}
	viaTLS, err := tlsSession(ctx, r, sc, target, opts...)
	if err != nil {
		return fmt.Errorf("%s: %w", target, err)
	}
	if sc.Expect.SameSessionID && viaTLS != viaUnix.GetSessionId() {
		return fmt.Errorf("unix session %s, tls session %s", viaUnix.GetSessionId(), viaTLS)
	}
	return nil
}

func tlsCustomCA(ctx context.Context, r *runner, sc *scenario) error {
	if r.tlsArgs.tls == "" {
		return errors.New("no --tls target given")
	}
	if err := sameSession(ctx, r, sc, r.tlsArgs.tls, sidecar.WithCAFile(r.tlsArgs.ca)); err != nil {
		return err
	}
	return tlsRefused(ctx, r, sc, r.tlsArgs.tls, sc.Expect.WrongCACode, "", sidecar.WithCAFile(r.tlsArgs.wrongCA))
}

func mtlsClientCert(ctx context.Context, r *runner, sc *scenario) error {
	if r.tlsArgs.mtls == "" {
		return errors.New("no --mtls target given")
	}
	a := r.tlsArgs
	if err := sameSession(ctx, r, sc, a.mtls, sidecar.WithCAFile(a.ca), sidecar.WithClientCert(a.clientCert, a.clientKey)); err != nil {
		return err
	}
	if err := tlsRefused(ctx, r, sc, a.mtls, sc.Expect.WithoutClientCertCode, sc.Expect.WithoutClientCertMatches,
		sidecar.WithCAFile(a.ca)); err != nil {
		return fmt.Errorf("without a client certificate: %w", err)
	}
	if err := tlsRefused(ctx, r, sc, a.mtls, sc.Expect.WithoutClientCertCode, sc.Expect.ForeignClientCertMatches,
		sidecar.WithCAFile(a.ca), sidecar.WithClientCert(a.foreignCert, a.foreignKey)); err != nil {
		return fmt.Errorf("with a client certificate of another CA: %w", err)
	}
	return nil
}

// codeName is a code as the protos spell it: Unavailable -> UNAVAILABLE,
// DeadlineExceeded -> DEADLINE_EXCEEDED.
func codeName(c codes.Code) string {
	var b strings.Builder
	for i, ch := range c.String() {
		if i > 0 && unicode.IsUpper(ch) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(ch))
	}
	return b.String()
}
