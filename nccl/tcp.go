package nccl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rlpipe/rlpipe/gpu"
)

// TCPConfig says how a process joins a communicator whose ranks are
// processes, on one host or several.
type TCPConfig struct {
	// Rank is this process's rank in [0, Size).
	Rank, Size int
	// Addr is host:port of rank 0. Rank 0 listens on its port on every
	// interface; the others dial it.
	Addr string
	// Job names the job (the launcher's run id); a process of another job
	// that reaches the same address is refused. Empty matches only empty.
	Job string
	// Timeout bounds joining: how long rank 0 waits for every other rank,
	// and how long the others try to reach rank 0 (default 5 minutes).
	Timeout time.Duration
	// Host names this process in errors (default: the host name).
	Host string
	// Name names the communicator in its errors ("cp group 1:
	// communicator aborted: ..."); empty names none.
	Name string
}

// DefaultJoinTimeout is how long JoinTCP waits for the other ranks when
// TCPConfig.Timeout is zero.
const DefaultJoinTimeout = 5 * time.Minute

// JoinTCP returns this process's rank of a host-memory communicator whose
// ranks are processes joined over TCP through rank 0. Its collectives have
// the loopback's arguments, checks and results, bit for bit: every rank
// sends its source to rank 0, which checks the ranks agree, reduces in rank
// order and sends every rank its result. Rank 0 moves Size times the data,
// so it suits control traffic and CPU runs, not bandwidth.
//
// A rank that fails, closes its communicator, or whose process dies (its
// connection drops) aborts the communicator for all: their pending and
// later calls return an error that names the rank and its host. JoinTCP
// fails, naming the missing ranks, when they do not all join within the
// timeout.
func JoinTCP(ctx context.Context, cfg TCPConfig) (Comm, error) {
	c, err := joinTCP(ctx, cfg, nil)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// joinTCP is JoinTCP; rank 0 accepts the others on ln when it is not nil
// (Split's groups listen on a port of the system's choosing before they
// say where), and closes it.
func joinTCP(ctx context.Context, cfg TCPConfig, ln *net.TCPListener) (*tcpComm, error) {
	if ln != nil {
		defer ln.Close()
	}
	if cfg.Size < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return nil, fmt.Errorf("tcp: rank %d outside [0,%d)", cfg.Rank, cfg.Size)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultJoinTimeout
	}
	if cfg.Host == "" {
		cfg.Host, _ = os.Hostname()
	}
	c := &tcpComm{rank: cfg.Rank, size: cfg.Size, host: cfg.Host, addr: cfg.Addr, name: cfg.Name, broken: make(chan struct{}), peers: make([]*peer, cfg.Size)}
	if cfg.Size == 1 {
		return c, nil
	}
	err := ctx.Err()
	switch {
	case err != nil:
		err = fmt.Errorf("tcp: rank %d on %s: %w", c.rank, c.host, err)
	case cfg.Rank == 0:
		err = c.accept(ctx, cfg, ln)
	default:
		err = c.dial(ctx, cfg)
	}
	if err != nil {
		for _, p := range c.peers {
			if p != nil {
				p.conn.Close()
			}
		}
		if cfg.Name != "" {
			err = fmt.Errorf("%s: %w", cfg.Name, err)
		}
		return nil, err
	}
	for _, p := range c.peers {
		if p != nil {
			go c.read(p)
		}
	}
	return c, nil
}

// hangUpGrace is how long a rank whose send to rank 0 failed waits for
// rank 0's last word (the reason it hung up) before it blames the
// connection.
const hangUpGrace = 2 * time.Second

// keepAlive detects a peer host that vanished (no FIN, no RST) in about
// half a minute.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

// hello is what a rank says when it connects to rank 0.
type hello struct {
	rank, size int
	pid        int
	host, job  string
}

const helloMagic = "rlpipe-tcp-1\n"

func writeHello(w io.Writer, h hello) error {
	var b []byte
	b = append(b, helloMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(h.rank))
	b = binary.LittleEndian.AppendUint32(b, uint32(h.size))
	b = binary.LittleEndian.AppendUint32(b, uint32(h.pid))
	b = appendString(b, h.host)
	b = appendString(b, h.job)
	_, err := w.Write(b)
	return err
}

func readHello(r io.Reader) (hello, error) {
	magic := make([]byte, len(helloMagic))
	if _, err := io.ReadFull(r, magic); err != nil {
		return hello{}, err
	}
	if string(magic) != helloMagic {
		return hello{}, errors.New("not an rlpipe rank (bad greeting)")
	}
	var fixed [12]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return hello{}, err
	}
	h := hello{rank: int(binary.LittleEndian.Uint32(fixed[0:])), size: int(binary.LittleEndian.Uint32(fixed[4:])), pid: int(binary.LittleEndian.Uint32(fixed[8:]))}
	var err error
	if h.host, err = readString(r); err != nil {
		return hello{}, err
	}
	if h.job, err = readString(r); err != nil {
		return hello{}, err
	}
	return h, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

func readString(r io.Reader) (string, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return "", err
	}
	l := binary.LittleEndian.Uint32(n[:])
	if l > 1<<16 {
		return "", fmt.Errorf("string of %d bytes in a greeting", l)
	}
	b := make([]byte, l)
	_, err := io.ReadFull(r, b)
	return string(b), err
}

// accept is rank 0's join: listen (on ln when not nil), take a greeting
// from every other rank and answer all once the world is complete ("" ok,
// else why not).
func (c *tcpComm) accept(ctx context.Context, cfg TCPConfig, ln *net.TCPListener) error {
	if ln == nil {
		var err error
		if ln, err = listenTCP(ctx, cfg.Addr); err != nil {
			return fmt.Errorf("tcp: rank 0 on %s: %w", c.host, err)
		}
		defer ln.Close()
	}
	deadline := time.Now().Add(cfg.Timeout)
	ln.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	joined := make([]hello, cfg.Size)
	refuse := func(err error) error {
		for _, p := range c.peers {
			if p != nil {
				p.conn.SetWriteDeadline(time.Now().Add(time.Second))
				writeReply(p.conn, err.Error())
			}
		}
		return err
	}
	for n := 1; n < cfg.Size; {
		conn, err := ln.Accept()
		if err != nil {
			switch {
			case ctx.Err() != nil:
				err = ctx.Err()
			case errors.Is(err, os.ErrDeadlineExceeded):
				err = fmt.Errorf("%s did not join within %v", missing(c.peers, cfg.Size), cfg.Timeout)
			}
			return refuse(fmt.Errorf("tcp: rank 0 on %s, waiting at %s: %w", c.host, cfg.Addr, err))
		}
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		h, err := readHello(conn)
		conn.SetReadDeadline(time.Time{})
		if err != nil {
			conn.Close() // not one of ours, or it hung up: wait for the real one
			continue
		}
		var bad error
		switch {
		case h.job != cfg.Job:
			bad = fmt.Errorf("a rank of job %q (host %s, pid %d) reached rank 0 of job %q", h.job, h.host, h.pid, cfg.Job)
		case h.size != cfg.Size:
			bad = fmt.Errorf("rank %d on %s (pid %d) has world size %d, rank 0 on %s has %d", h.rank, h.host, h.pid, h.size, c.host, cfg.Size)
		case h.rank <= 0 || h.rank >= cfg.Size:
			bad = fmt.Errorf("rank %d on %s (pid %d) is outside [1,%d)", h.rank, h.host, h.pid, cfg.Size)
		case c.peers[h.rank] != nil:
			o := joined[h.rank]
			bad = fmt.Errorf("rank %d joined twice: from %s (pid %d) and %s (pid %d)", h.rank, o.host, o.pid, h.host, h.pid)
		}
		if bad != nil {
			if h.job != cfg.Job {
				// Another job's process: turn it away, keep waiting for ours.
				conn.SetWriteDeadline(time.Now().Add(time.Second))
				writeReply(conn, bad.Error())
				conn.Close()
				continue
			}
			conn.SetWriteDeadline(time.Now().Add(time.Second))
			writeReply(conn, bad.Error())
			conn.Close()
			return refuse(fmt.Errorf("tcp: %w", bad))
		}
		joined[h.rank] = h
		c.peers[h.rank] = &peer{rank: h.rank, host: h.host, pid: h.pid, conn: conn, in: make(chan frame), gone: make(chan struct{})}
		n++
	}
	for _, p := range c.peers {
		if p != nil {
			if err := writeReply(p.conn, ""); err != nil {
				return fmt.Errorf("tcp: rank 0 on %s: answering rank %d on %s: %w", c.host, p.rank, p.host, err)
			}
		}
	}
	return nil
}

// listenTCP listens on every interface at the port of addr (host:port;
// port 0: one the system chooses).
func listenTCP(ctx context.Context, addr string) (*net.TCPListener, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("rank 0 address %q: %w", addr, err)
	}
	lc := net.ListenConfig{KeepAliveConfig: keepAlive}
	ln, err := lc.Listen(ctx, "tcp", ":"+port)
	if err != nil {
		return nil, fmt.Errorf("%w (is another job using port %s? choose another with MASTER_PORT or RLPIPE_PORT)", err, port)
	}
	return ln.(*net.TCPListener), nil
}

// missing names the ranks that have not joined.
func missing(peers []*peer, size int) string {
	var m []string
	for r := 1; r < size; r++ {
		if peers[r] == nil {
			m = append(m, strconv.Itoa(r))
		}
	}
	if len(m) == 1 {
		return "rank " + m[0] + " of " + strconv.Itoa(size)
	}
	return "ranks " + strings.Join(m, ", ") + " of " + strconv.Itoa(size)
}

func writeReply(w io.Writer, msg string) error {
	_, err := w.Write(appendString(nil, msg))
	return err
}

// dial is the join of a rank other than 0: reach rank 0 (retrying until the
// timeout: it may start later), greet it and wait for the world to be
// complete.
func (c *tcpComm) dial(ctx context.Context, cfg TCPConfig) error {
	deadline := time.Now().Add(cfg.Timeout)
	d := net.Dialer{KeepAliveConfig: keepAlive, Timeout: 10 * time.Second}
	var conn net.Conn
	wait := 10 * time.Millisecond // doubled up to a second: rank 0 may start late
	for {
		var err error
		if conn, err = d.DialContext(ctx, "tcp", cfg.Addr); err == nil {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("tcp: rank %d on %s: %w", c.rank, c.host, ctx.Err())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("tcp: rank %d on %s: cannot reach rank 0 at %s within %v: %w", c.rank, c.host, cfg.Addr, cfg.Timeout, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
	c.peers[0] = &peer{rank: 0, host: cfg.Addr, conn: conn, in: make(chan frame), gone: make(chan struct{})}
	if err := writeHello(conn, hello{rank: cfg.Rank, size: cfg.Size, pid: os.Getpid(), host: c.host, job: cfg.Job}); err != nil {
		return fmt.Errorf("tcp: rank %d on %s: greeting rank 0 at %s: %w", c.rank, c.host, cfg.Addr, err)
	}
	// Rank 0 answers when every rank has joined, or says why not.
	conn.SetReadDeadline(deadline.Add(30 * time.Second))
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Now()) })
	msg, err := readString(conn)
	stop()
	conn.SetReadDeadline(time.Time{})
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("tcp: rank %d on %s: %w", c.rank, c.host, ctx.Err())
	case err != nil:
		return fmt.Errorf("tcp: rank %d on %s: waiting for rank 0 at %s to start the job: %w", c.rank, c.host, cfg.Addr, err)
	case msg != "":
		return fmt.Errorf("tcp: rank %d on %s: rank 0 at %s did not start the job: %s", c.rank, c.host, cfg.Addr, msg)
	}
	return nil
}

// frame is one message between a rank and rank 0: a post (rank → 0), a
// result (0 → rank; msg is an argument error), an abort or a close (either
// way; msg says why).
type frame struct {
	typ   uint8
	kind  uint8
	op    uint8
	dt    uint8
	root  int32
	count int64
	msg   string
	data  []byte
}

const (
	frameData  uint8 = 1
	frameAbort uint8 = 2 // the sender failed: every rank must stop
	frameClose uint8 = 3 // the sender is done: collectives that need it fail

	frameHeader = 1 + 1 + 1 + 1 + 4 + 8 + 4 + 8
	// maxFrame bounds what a rank accepts in one frame (1 TiB): a larger
	// length is a corrupt stream, not a tensor.
	maxFrame = 1 << 40
)

func writeFrame(w io.Writer, f frame) error {
	h := make([]byte, frameHeader, frameHeader+len(f.msg))
	h[0], h[1], h[2], h[3] = f.typ, f.kind, f.op, f.dt
	binary.LittleEndian.PutUint32(h[4:], uint32(f.root))
	binary.LittleEndian.PutUint64(h[8:], uint64(f.count))
	binary.LittleEndian.PutUint32(h[16:], uint32(len(f.msg)))
	binary.LittleEndian.PutUint64(h[20:], uint64(len(f.data)))
	h = append(h, f.msg...)
	if _, err := w.Write(h); err != nil {
		return err
	}
	if len(f.data) > 0 {
		_, err := w.Write(f.data)
		return err
	}
	return nil
}

func readFrame(r io.Reader) (frame, error) {
	var h [frameHeader]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return frame{}, err
	}
	f := frame{typ: h[0], kind: h[1], op: h[2], dt: h[3], root: int32(binary.LittleEndian.Uint32(h[4:])), count: int64(binary.LittleEndian.Uint64(h[8:]))}
	ml, dl := binary.LittleEndian.Uint32(h[16:]), binary.LittleEndian.Uint64(h[20:])
	if f.typ < frameData || f.typ > frameClose || ml > 1<<20 || dl > maxFrame {
		return frame{}, errors.New("corrupt stream")
	}
	msg := make([]byte, ml)
	if _, err := io.ReadFull(r, msg); err != nil {
		return frame{}, err
	}
	f.msg = string(msg)
	if dl > 0 {
		f.data = make([]byte, dl)
		if _, err := io.ReadFull(r, f.data); err != nil {
			return frame{}, err
		}
	}
	return f, nil
}

// peer is the other end of a connection: on rank 0 every other rank, on
// the others rank 0.
type peer struct {
	rank int
	host string // on the other ranks: rank 0's address
	pid  int
	conn net.Conn
	wmu  sync.Mutex
	in   chan frame    // data frames, in order
	gone chan struct{} // closed when the peer closed its communicator
}

func (p *peer) send(f frame) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	return writeFrame(p.conn, f)
}

// hangUp sends p a last frame (an abort or a close) after any frame being
// written, waiting at most a moment for it to go, and closes the
// connection.
func (p *peer) hangUp(f frame) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	p.conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
	writeFrame(p.conn, f)
	p.conn.Close()
}

func (p *peer) String() string {
	if p.pid == 0 {
		return fmt.Sprintf("rank %d at %s", p.rank, p.host)
	}
	return fmt.Sprintf("rank %d on %s (pid %d)", p.rank, p.host, p.pid)
}

type tcpComm struct {
	rank, size int
	host, addr string
	name       string  // the communicator's name in errors, if any
	peers      []*peer // rank 0: every other rank by rank; others: rank 0 at [0]

	mu sync.Mutex // one collective at a time

	emu     sync.Mutex
	err     error
	aborted bool          // err is a failure, not a close
	broken  chan struct{} // closed on abort or close
}

// Done is closed when the communicator is aborted or closed.
func (c *tcpComm) Done() <-chan struct{} { return c.broken }

func (c *tcpComm) Rank() int { return c.rank }
func (c *tcpComm) Size() int { return c.size }

// On returns c: its collectives complete before they return.
func (c *tcpComm) On(gpu.Stream) Comm { return c }

// Close ends this rank's part: the others' collectives that need it from
// now on fail, naming it, instead of hanging; results already on their way
// to them still arrive.
func (c *tcpComm) Close() error {
	c.emu.Lock()
	if c.err != nil {
		c.emu.Unlock()
		return nil
	}
	c.err = fmt.Errorf("%srank %d on %s: communicator closed", c.prefix(), c.rank, c.host)
	close(c.broken)
	c.emu.Unlock()
	c.hangUp(frame{typ: frameClose, msg: fmt.Sprintf("rank %d on %s closed its communicator", c.rank, c.host)})
	return nil
}

// Abort aborts the communicator for all ranks with the reason err, which
// their errors will quote.
func (c *tcpComm) Abort(err error) {
	c.abort(fmt.Errorf("rank %d on %s failed: %w", c.rank, c.host, err))
}

// abort marks the communicator failed with cause, tells the other end(s)
// why, and hangs up. It returns the communicator's error (the first cause).
func (c *tcpComm) abort(cause error) error {
	c.emu.Lock()
	if c.err != nil {
		c.emu.Unlock()
		return c.err
	}
	c.err = fmt.Errorf("%scommunicator aborted: %w", c.prefix(), cause)
	c.aborted = true
	close(c.broken)
	c.emu.Unlock()
	c.hangUp(frame{typ: frameAbort, msg: cause.Error()})
	return c.err
}

// hangUp sends every peer f and closes the connections.
func (c *tcpComm) hangUp(f frame) {
	var wg sync.WaitGroup
	for _, p := range c.peers {
		if p != nil {
			wg.Go(func() { p.hangUp(f) })
		}
	}
	wg.Wait()
}

// prefix is the communicator's name before an error ("cp group 1: "),
// or "".
func (c *tcpComm) prefix() string {
	if c.name == "" {
		return ""
	}
	return c.name + ": "
}

// failure returns the communicator's error when it was aborted (nil while
// it works and after a close).
func (c *tcpComm) failure() error {
	c.emu.Lock()
	defer c.emu.Unlock()
	if !c.aborted {
		return nil
	}
	return c.err
}

func (c *tcpComm) failed() error {
	c.emu.Lock()
	defer c.emu.Unlock()
	return c.err
}

// read passes p's data frames to p.in until the connection ends: a close
// marks p gone, an abort or a lost connection aborts the communicator.
func (c *tcpComm) read(p *peer) {
	for {
		f, err := readFrame(p.conn)
		switch {
		case err != nil:
			if c.failed() == nil {
				c.abort(fmt.Errorf("lost %v: %v", p, err))
			}
			return
		case f.typ == frameAbort:
			c.abort(errors.New(f.msg))
			return
		case f.typ == frameClose:
			close(p.gone)
			return
		}
		select {
		case p.in <- f:
		case <-c.broken:
			return
		}
	}
}

// receive waits for p's next data frame. A peer that closed its
// communicator instead aborts it: the collective cannot complete.
func (c *tcpComm) receive(ctx context.Context, p *peer) (frame, error) {
	select {
	case f := <-p.in:
		return f, nil
	case <-p.gone:
		return frame{}, c.abort(fmt.Errorf("%v closed its communicator while rank %d on %s waited for it", p, c.rank, c.host))
	case <-c.broken:
		return frame{}, c.failed()
	case <-ctx.Done():
		return frame{}, c.abort(fmt.Errorf("rank %d on %s: %w", c.rank, c.host, ctx.Err()))
	}
}

// run performs one collective.
func (c *tcpComm) run(ctx context.Context, p post) error {
	if ctx == nil {
		ctx = context.Background()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.failed(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return c.abort(fmt.Errorf("rank %d on %s: %w", c.rank, c.host, err))
	}
	if c.size == 1 {
		posts := []post{p}
		if err := check(posts); err != nil {
			return err
		}
		out, err := result(posts, 0)
		if err != nil {
			return err
		}
		copy(p.dest(), out)
		return nil
	}
	if c.rank == 0 {
		return c.gather(ctx, p)
	}
	return c.exchange(ctx, p)
}

// sends reports whether a rank's post carries its source bytes.
func sends(p post, rank int) bool {
	return p.invalidArg == nil && p.kind != kindBarrier && (p.kind != kindBroadcast || p.root == rank)
}

// exchange is a collective on a rank other than 0: post, then wait for the
// result.
func (c *tcpComm) exchange(ctx context.Context, p post) error {
	f := frame{typ: frameData, kind: p.kind, op: uint8(p.op), dt: uint8(p.dt), root: int32(p.root), count: int64(p.count)}
	if p.invalidArg != nil {
		f.msg = p.invalidArg.Error()
	}
	if sends(p, c.rank) {
		f.data = p.src
	}
	hub := c.peers[0]
	if err := hub.send(f); err != nil {
		// Rank 0 hung up, maybe after saying why (an abort naming the rank
		// that failed): let the reader take that in first.
		select {
		case <-c.broken:
			return c.failed()
		case <-time.After(hangUpGrace):
		}
		return c.abort(fmt.Errorf("rank %d on %s: lost %v: %v", c.rank, c.host, hub, err))
	}
	res, err := c.receive(ctx, hub)
	if err != nil {
		return err
	}
	if res.msg != "" {
		return errors.New(res.msg)
	}
	dst := p.dest()
	want := len(dst)
	if p.kind == kindBarrier || (p.kind == kindBroadcast && p.root == c.rank) {
		want = 0
	}
	if len(res.data) != want {
		return c.abort(fmt.Errorf("rank %d on %s: corrupt result from rank 0: %d bytes, want %d", c.rank, c.host, len(res.data), want))
	}
	copy(dst, res.data)
	return nil
}

// gather is a collective on rank 0: collect every rank's post, check them,
// compute and send every rank its result.
func (c *tcpComm) gather(ctx context.Context, p post) error {
	posts := make([]post, c.size)
	posts[0] = p
	for r := 1; r < c.size; r++ {
		f, err := c.receive(ctx, c.peers[r])
		if err != nil {
			return err
		}
		q := post{kind: f.kind, op: Op(f.op), dt: gpu.DType(f.dt), root: int(f.root), count: int(f.count), src: f.data}
		switch {
		case f.msg != "":
			q.invalidArg = errors.New(f.msg)
		case sends(q, r) && int64(len(f.data)) != f.count*int64(q.dt.Size()):
			q.invalidArg = fmt.Errorf("sent %d bytes for %d %v elements", len(f.data), f.count, q.dt)
		}
		posts[r] = q
	}
	err := check(posts)
	var outs [][]byte
	if err == nil {
		outs, err = results(posts)
	}
	var wg sync.WaitGroup
	lost := make([]error, c.size)
	for r := 1; r < c.size; r++ {
		f := frame{typ: frameData}
		if err != nil {
			f.msg = err.Error()
		} else {
			f.data = outs[r]
		}
		wg.Go(func() { lost[r] = c.peers[r].send(f) })
	}
	wg.Wait()
	for r, e := range lost {
		if e != nil {
			return c.abort(fmt.Errorf("lost %v: %v", c.peers[r], e))
		}
	}
	if err != nil {
		return err
	}
	if outs[0] != nil {
		copy(p.dest(), outs[0])
	}
	return nil
}

func (c *tcpComm) AllGather(ctx context.Context, dst, src gpu.Tensor) error {
	return c.run(ctx, allGatherPost(c.size, dst, src))
}

func (c *tcpComm) ReduceScatter(ctx context.Context, dst, src gpu.Tensor, op Op) error {
	return c.run(ctx, reduceScatterPost(c.size, dst, src, op))
}

func (c *tcpComm) AllReduce(ctx context.Context, buf gpu.Tensor, op Op) error {
	return c.run(ctx, allReducePost(buf, op))
}

func (c *tcpComm) Broadcast(ctx context.Context, buf gpu.Tensor, root int) error {
	return c.run(ctx, broadcastPost(c.size, buf, root))
}

func (c *tcpComm) Barrier(ctx context.Context) error {
	return c.run(ctx, post{kind: kindBarrier})
}
