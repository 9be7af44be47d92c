package main

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
)

// cutProxy forwards a local Unix socket to the sidecar's socket and can cut
// every live connection at once, to simulate a dropped connection mid-stream.
// The client under test reconnects through it.
type cutProxy struct {
	ln       net.Listener
	dir      string
	upstream string

	mu       sync.Mutex
	conns    []net.Conn
	accepted int
}

// newCutProxy listens on a fresh socket and forwards to upstream (a path).
func newCutProxy(upstream string) (*cutProxy, error) {
	dir, err := os.MkdirTemp("", "conf-proxy-")
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "proxy.sock"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p := &cutProxy{ln: ln, dir: dir, upstream: upstream}
	go p.serve()
	return p, nil
}

// target is the address clients dial.
func (p *cutProxy) target() string { return "unix:" + p.ln.Addr().String() }

func (p *cutProxy) serve() {
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("unix", p.upstream)
		if err != nil {
			down.Close()
			continue
		}
		p.mu.Lock()
		p.accepted++
		p.conns = append(p.conns, down, up)
		p.mu.Unlock()
		go pipe(down, up)
		go pipe(up, down)
	}
}

func pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// cut closes every live connection (both sides); the listener stays open.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// connections reports how many client connections the proxy has accepted.
func (p *cutProxy) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

func (p *cutProxy) close() {
	p.ln.Close()
	p.cut()
	os.RemoveAll(p.dir)
}
