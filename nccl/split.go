package nccl

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rlpipe/rlpipe/gpu"
)

// SplitConfig says which group of a communicator's ranks a rank joins in
// Split.
type SplitConfig struct {
	// Color picks the group: the ranks that pass the same color form one.
	// It must be in [0, 2³¹).
	Color int
	// Key orders the group's ranks: its rank 0 is the one with the
	// smallest key, ties going in the parent's rank order. It must fit in
	// 32 bits.
	Key int
	// Name names the group in its errors (default "group <color>").
	Name string
	// Timeout bounds how long the group's ranks take to connect (default
	// DefaultJoinTimeout).
	Timeout time.Duration
}

// splitAddrBytes is the size of a rank's record in Split's second
// exchange: a status byte, the group's address and job, or why its rank
// 0 could not listen.
const splitAddrBytes = 512

// The status byte of a record of the second exchange.
const (
	splitNone   byte = iota // not a group's rank 0, or a group of one
	splitListen             // rank 0 of a group listens at the record's address
	splitFailed             // rank 0 of a group could not listen: the record says why
)

// Split returns this rank's communicator over the ranks of parent that pass
// the same color, ordered by key: context parallelism's cp groups of a
// dp × cp world of processes, say (color the dp rank, key the cp rank).
// Every rank of parent must call it, like a collective. The result is a
// TCP communicator of its own (JoinTCP's), so the groups' collectives run
// concurrently with parent's and with each other's; parent only carries
// the colors and keys and each group's address. The group's rank 0 listens
// on a port the system chooses, on every interface, at the address parent
// reaches this host by (a JoinTCP communicator's; for any other, such as
// the loopback, 127.0.0.1: its ranks must then be on this host), and the
// others connect to it, with a job name only the group knows. parent must
// be a host-memory communicator; it stays open, and Split's result is
// closed on its own.
//
// Split fails on every rank if any rank's color or key is out of range.
// If parent fails (is aborted) while the group joins, or later, the group
// is aborted too, so that no rank waits on a group whose world is gone;
// closing parent does not close the group.
func Split(ctx context.Context, parent Comm, cfg SplitConfig) (Comm, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if cfg.Name == "" {
		cfg.Name = "group " + strconv.Itoa(cfg.Color)
	}
	me, n := parent.Rank(), parent.Size()
	// The first exchange: every rank's color and key (color −1: out of
	// range, which fails every rank).
	color, key := int32(cfg.Color), int32(cfg.Key)
	var bad error
	switch {
	case cfg.Color < 0 || cfg.Color > math.MaxInt32:
		bad = fmt.Errorf("split: color %d outside [0,2³¹)", cfg.Color)
	case cfg.Key < math.MinInt32 || cfg.Key > math.MaxInt32:
		bad = fmt.Errorf("split: key %d does not fit in 32 bits", cfg.Key)
	}
	if bad != nil {
		color, key = -1, 0
	}
	mine := make(Bytes, 8)
	binary.LittleEndian.PutUint32(mine, uint32(color))
	binary.LittleEndian.PutUint32(mine[4:], uint32(key))
	all := make(Bytes, 8*n)
	if err := parent.AllGather(ctx, i32Tensor(all), i32Tensor(mine)); err != nil {
		return nil, fmt.Errorf("split: %w", err)
	}
	if bad != nil {
		return nil, bad
	}
	var group []int // parent ranks of this rank's group, in group order
	keys := make([]int32, n)
	for r := range n {
		c := int32(binary.LittleEndian.Uint32(all[8*r:]))
		keys[r] = int32(binary.LittleEndian.Uint32(all[8*r+4:]))
		if c < 0 {
			return nil, fmt.Errorf("split: rank %d passed a color or key out of range", r)
		}
		if c == color {
			group = append(group, r)
		}
	}
	slices.SortStableFunc(group, func(a, b int) int { return cmp.Compare(keys[a], keys[b]) })
	rank := slices.Index(group, me)
	size := len(group)

	// The second exchange: where each group's rank 0 listens.
	rec := make(Bytes, splitAddrBytes)
	var (
		ln        *net.TCPListener
		addr, job string
	)
	if rank == 0 && size > 1 {
		var err error
		ln, err = listenTCP(ctx, ":0")
		if err == nil {
			addr = net.JoinHostPort(splitHost(parent), strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
			job, err = splitJob()
		}
		if err != nil {
			if ln != nil {
				ln.Close()
				ln = nil
			}
			putRecord(rec, splitFailed, err.Error())
		} else {
			putRecord(rec, splitListen, addr+"\n"+job)
		}
	}
	all = make(Bytes, splitAddrBytes*n)
	if err := parent.AllGather(ctx, i32Tensor(all), i32Tensor(rec)); err != nil {
		if ln != nil {
			ln.Close()
		}
		return nil, fmt.Errorf("split: %w", err)
	}
	leader := group[0]
	status, msg := getRecord(all[splitAddrBytes*leader : splitAddrBytes*(leader+1)])
	switch {
	case size == 1:
	case status == splitFailed:
		return nil, fmt.Errorf("%s: rank 0 (rank %d of the parent) cannot listen: %s", cfg.Name, leader, msg)
	case status != splitListen:
		return nil, fmt.Errorf("%s: rank 0 (rank %d of the parent) did not say where it listens", cfg.Name, leader)
	default:
		var ok bool
		if addr, job, ok = strings.Cut(msg, "\n"); !ok || addr == "" {
			return nil, fmt.Errorf("%s: rank 0 (rank %d of the parent) sent a bad address %q", cfg.Name, leader, msg)
		}
	}

	if splitJoinHook != nil {
		splitJoinHook(me)
	}
	// Join the group, giving up if parent fails meanwhile.
	pc, _ := parent.(*tcpComm)
	jctx, cancel := context.WithCancel(ctx)
	defer cancel()
	host := ""
	if pc != nil {
		host = pc.host
		go func() {
			select {
			case <-pc.Done():
				cancel()
			case <-jctx.Done():
			}
		}()
	}
	c, err := joinTCP(jctx, TCPConfig{Rank: rank, Size: size, Addr: addr, Job: job, Timeout: cfg.Timeout, Host: host, Name: cfg.Name}, ln)
	if err != nil {
		if pc != nil && ctx.Err() == nil {
			if perr := pc.failed(); perr != nil {
				return nil, fmt.Errorf("%s: the parent communicator failed while the group joined: %w", cfg.Name, perr)
			}
		}
		return nil, err
	}
	if pc != nil {
		go c.follow(pc)
	}
	return c, nil
}

// splitJoinHook, when set (by tests), is called by every rank of Split
// with its parent rank once the group's address is known, before joining
// the group.
var splitJoinHook func(parentRank int)

// follow aborts c when parent fails (not when it is closed), until c
// itself is aborted or closed.
func (c *tcpComm) follow(parent *tcpComm) {
	select {
	case <-parent.Done():
		if err := parent.failure(); err != nil {
			c.abort(fmt.Errorf("parent %w", err))
		}
	case <-c.Done():
	}
}

// i32Tensor views b (a multiple of 4 bytes) as an I32 tensor.
func i32Tensor(b Bytes) gpu.Tensor {
	return gpu.Tensor{Mem: b, DType: gpu.I32, Shape: []int{len(b) / 4}}
}

// splitHost returns the address by which this rank's host is reached
// from the other ranks of parent: for a JoinTCP communicator, this end's
// address of its connections (the interface the ranks already talk over);
// for others, 127.0.0.1.
func splitHost(parent Comm) string {
	if c, ok := parent.(*tcpComm); ok {
		for _, p := range c.peers {
			if p == nil {
				continue
			}
			if a, ok := p.conn.LocalAddr().(*net.TCPAddr); ok && !a.IP.IsUnspecified() {
				return a.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

// splitJob returns a fresh job name for a group: only its ranks learn it,
// so that no other process can join the group.
func splitJob() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "split-" + hex.EncodeToString(b), nil
}

// putRecord writes status and msg (cut to fit) into rec.
func putRecord(rec Bytes, status byte, msg string) {
	msg = msg[:min(len(msg), len(rec)-5)]
	rec[0] = status
	binary.LittleEndian.PutUint32(rec[1:], uint32(len(msg)))
	copy(rec[5:], msg)
}

// getRecord reads a record of putRecord.
func getRecord(rec Bytes) (byte, string) {
	l := int(binary.LittleEndian.Uint32(rec[1:]))
	if l > len(rec)-5 {
		return splitNone, ""
	}
	return rec[0], string(rec[5 : 5+l])
}
