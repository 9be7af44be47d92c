// Command conformance runs the shared conformance scenarios
// (clients/conformance/scenarios.json) against a live sidecar using the Go
// client package only, printing one JSON object per scenario on stdout:
//
//	conformance --lang go --unix unix:/tmp/d/sidecar.sock --tcp 127.0.0.1:PORT \
//	    --token TOKEN --tls 127.0.0.1:PORT --mtls 127.0.0.1:PORT --ca CA.pem \
//	    --wrong-ca OTHER.pem --client-cert C.pem --client-key C.key \
//	    --foreign-cert F.pem --foreign-key F.key \
//	    --scenarios clients/conformance/scenarios.json
//
// It exits 0 once every scenario has run, whatever their outcome.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/agent-sidecar/agent-sidecar/clients/go/sidecar"
)

const scenarioTimeout = 20 * time.Second

// result is one output line.
type result struct {
	Scenario string `json:"scenario"`
	OK       bool   `json:"ok"`
	Error    string `json:"error,omitempty"`
}

// runner holds the flags and the shared connections.
type runner struct {
	lang, unixTarget, tcpTarget, token string
	proxy, proxyControl                string
	tlsArgs                            tlsArgs

	unix *sidecar.Client // lazily dialled, reused across scenarios
}

func main() {
	var r runner
	var path string
	flag.StringVar(&r.lang, "lang", "go", "language name substituted for {lang}")
	flag.StringVar(&r.unixTarget, "unix", "", "Unix socket target, unix:/path/sidecar.sock")
	flag.StringVar(&r.tcpTarget, "tcp", "", "TCP target, host:port")
	flag.StringVar(&r.token, "token", "", "bearer token for TCP")
	flag.StringVar(&r.proxy, "proxy", "", "the harness's cuttable proxy, host:port")
	flag.StringVar(&r.proxyControl, "proxy-control", "", "the proxy's control port, host:port")
	flag.StringVar(&r.tlsArgs.tls, "tls", "", "TLS listener, host:port")
	flag.StringVar(&r.tlsArgs.mtls, "mtls", "", "mTLS listener, host:port")
	flag.StringVar(&r.tlsArgs.ca, "ca", "", "PEM CA of the TLS listeners' certificate")
	flag.StringVar(&r.tlsArgs.wrongCA, "wrong-ca", "", "PEM CA that signed nothing here")
	flag.StringVar(&r.tlsArgs.clientCert, "client-cert", "", "PEM client certificate for --mtls")
	flag.StringVar(&r.tlsArgs.clientKey, "client-key", "", "PEM key of --client-cert")
	flag.StringVar(&r.tlsArgs.foreignCert, "foreign-cert", "", "PEM client certificate of --wrong-ca (refused)")
	flag.StringVar(&r.tlsArgs.foreignKey, "foreign-key", "", "PEM key of --foreign-cert")
	flag.StringVar(&path, "scenarios", "clients/conformance/scenarios.json", "scenarios file")
	flag.Parse()
	if r.unixTarget == "" {
		fmt.Fprintln(os.Stderr, "conformance: --unix is required")
		os.Exit(2)
	}
	scenarios, err := loadScenarios(path, r.lang)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(2)
	}
	out := json.NewEncoder(os.Stdout)
	for _, sc := range scenarios {
		res := result{Scenario: sc.ID, OK: true}
		if err := r.run(sc); err != nil {
			res.OK, res.Error = false, err.Error()
		}
		_ = out.Encode(res)
	}
	if r.unix != nil {
		r.unix.Close()
	}
}

// loadScenarios reads the file, replacing {lang} in every string.
func loadScenarios(path, lang string) ([]*scenario, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	raw = bytes.ReplaceAll(raw, []byte("{lang}"), []byte(lang))
	var file struct {
		Scenarios []*scenario `json:"scenarios"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return file.Scenarios, nil
}

// run runs one scenario with a deadline, turning panics into failures.
func (r *runner) run(sc *scenario) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
		}
	}()
	fn, ok := scenarioFuncs[sc.ID]
	if !ok {
		return fmt.Errorf("unknown scenario %q", sc.ID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), scenarioTimeout)
	defer cancel()
	return fn(ctx, r, sc)
}

// unixClient returns the shared Unix-socket client, dialling it on first use.
func (r *runner) unixClient(ctx context.Context) (*sidecar.Client, error) {
	if r.unix != nil {
		return r.unix, nil
	}
	c, err := dial(ctx, r.unixTarget)
	if err != nil {
		return nil, err
	}
	r.unix = c
	return c, nil
}

// dial connects with a bounded wait.
func dial(ctx context.Context, target string, opts ...sidecar.Option) (*sidecar.Client, error) {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return sidecar.Dial(dctx, target, opts...)
}

// unixPath extracts the filesystem path from a unix: target.
func unixPath(target string) string {
	p := strings.TrimPrefix(target, "unix:")
	if strings.HasPrefix(p, "//") { // unix:///abs/path
		p = strings.TrimPrefix(p, "//")
	}
	return p
}
