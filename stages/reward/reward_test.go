package reward

import (
	"errors"
	"math"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestNewErrors(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		field string
		want  string
		is    error
	}{
		{"no source", Config{}, "", "set one of expr, command, url or plugin", nil},
		{"two sources", Config{Expr: "1", URL: "http://x"}, "", "not expr and url", nil},
		{"empty command", Config{Command: []string{}}, "command", "empty list", nil},
		{"empty program", Config{Command: []string{""}}, "command", "empty list", nil},
		{"missing program", Config{Command: []string{"no-such-reward-program-x9"}}, "command", `reward.command: program "no-such-reward-program-x9": executable file not found`, exec.ErrNotFound},
		{"bad scheme", Config{URL: "ftp://host/score"}, "url", "want an http or https url", nil},
		{"no host", Config{URL: "http:///score"}, "url", "has no host", nil},
		{"unparsable url", Config{URL: "http://[::1"}, "url", "invalid url", nil},
		{"negative timeout", Config{URL: "http://x", TimeoutS: -1}, "timeout_s", ">= 0", nil},
		{"nan timeout", Config{URL: "http://x", TimeoutS: math.NaN()}, "timeout_s", "finite", nil},
		{"tiny timeout", Config{URL: "http://x", TimeoutS: 1e-12}, "timeout_s", "too short", nil},
		{"timeout with expr", Config{Expr: "1", TimeoutS: 5}, "timeout_s", "not to expr", nil},
		{"retries with command", Config{Command: helperCommand("number"), Retries: 2}, "retries", "not to command", nil},
		{"negative retries", Config{URL: "http://x", Retries: -1}, "retries", ">= 0", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.cfg)
			if err == nil {
				t.Fatalf("New = %T, want an error", s)
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tt.field {
				t.Fatalf("error %v (%T), want a *ConfigError about %q", err, err, tt.field)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %q does not wrap %v", err, tt.is)
			}
		})
	}
}

func TestNewTimeouts(t *testing.T) {
	tests := []struct {
		cfg  Config
		want time.Duration
	}{
		{Config{URL: "https://verifier.local:8443/score"}, 300 * time.Second},
		{Config{URL: "http://x", TimeoutS: 1.5}, 1500 * time.Millisecond},
		{Config{Command: helperCommand("number")}, 300 * time.Second},
		{Config{Command: helperCommand("number"), TimeoutS: 20}, 20 * time.Second},
	}
	for _, tt := range tests {
		s, err := New(tt.cfg)
		if err != nil {
			t.Fatalf("New(%+v): %v", tt.cfg, err)
		}
		var got time.Duration
		switch s := s.(type) {
		case *httpScorer:
			got = s.timeout
		case *commandScorer:
			got = s.timeout
		default:
			t.Fatalf("New(%+v) = %T", tt.cfg, s)
		}
		if got != tt.want {
			t.Errorf("New(%+v): timeout %v, want %v", tt.cfg, got, tt.want)
		}
	}
}
