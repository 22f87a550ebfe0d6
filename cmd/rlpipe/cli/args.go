package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// boolFlag is the interface of the flag package's bool values: a flag
// whose IsBoolFlag is true takes no separate value.
type boolFlag interface {
	IsBoolFlag() bool
}

// newFlagSet returns the flag set of the command name, whose usage is
// text followed by the flags and their defaults.
func newFlagSet(name, text string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), text)
		fs.PrintDefaults()
	}
	return fs
}

// isHelp says whether arg asks for help: -h, -help or --help.
func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--help":
		return true
	}
	return false
}

// parseInterspersed sets fs's flags from args, wherever they stand among
// the positional arguments, and returns the positional arguments in
// order. A flag is -name or --name; a non-bool flag takes its value from
// -name=value or from the next argument (so --steps -3 gives --steps the
// value -3); a bool flag takes no separate value (-name=false turns it
// off). "--" ends the flags: every argument after it is positional, and
// so is "-" alone. It returns flag.ErrHelp for -h, -help or --help, and
// an error naming the flag for an unknown flag, a missing value or a
// value the flag does not take.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			return append(pos, args[i+1:]...), nil
		}
		if len(arg) < 2 || arg[0] != '-' {
			pos = append(pos, arg)
			continue
		}
		if isHelp(arg) {
			return nil, flag.ErrHelp
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(arg[1:], "-"), "=")
		f := fs.Lookup(name)
		if f == nil || name == "" {
			return nil, fmt.Errorf("unknown flag %s", arg)
		}
		if b, ok := f.Value.(boolFlag); ok && b.IsBoolFlag() && !hasValue {
			value, hasValue = "true", true
		}
		if !hasValue {
			if i+1 == len(args) {
				return nil, fmt.Errorf("flag --%s needs a value", name)
			}
			i++
			value = args[i]
		}
		if err := fs.Set(name, value); err != nil {
			return nil, fmt.Errorf("--%s %s: %v", name, value, flagValueError(f, err))
		}
	}
	return pos, nil
}

// flagValueError words the flag package's error for a value f cannot
// take.
func flagValueError(f *flag.Flag, err error) string {
	if !strings.HasSuffix(err.Error(), "parse error") {
		if strings.HasSuffix(err.Error(), "value out of range") {
			return "out of range"
		}
		return err.Error()
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return "invalid value"
	}
	switch g.Get().(type) {
	case int, int64, uint, uint64:
		return "not an integer"
	case float64:
		return "not a number"
	case bool:
		return "not true or false"
	case time.Duration:
		return "not a duration"
	}
	return "invalid value"
}

// parseFlags parses a command's flags and positional arguments, in any
// order, and checks the positional arguments against names: one name per
// argument, where a name ending in "?" is optional. Afterwards fs.Args()
// holds the positional arguments. It returns (code, false) when the
// command should stop: help asked (the command's usage on stdout, exit
// 0), or a usage error (one line on stderr naming the flag or argument,
// exit 2). With env.describe set it hands fs and names to it and stops,
// which is how completion learns every command's flags.
func parseFlags(fs *flag.FlagSet, env *cli, args []string, names ...string) (int, bool) {
	if env.describe != nil {
		env.describe(fs, names)
		return exitOK, false
	}
	fs.SetOutput(io.Discard)
	pos, err := parseInterspersed(fs, args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(env.stdout)
		fs.Usage()
		return exitOK, false
	case err != nil:
		return env.argError(fs, "%v", err), false
	}
	// Parsing "--" and the positionals makes fs.Args() return them.
	if err := fs.Parse(append([]string{"--"}, pos...)); err != nil {
		return env.argError(fs, "%v", err), false
	}
	required := 0
	for _, n := range names {
		if !strings.HasSuffix(n, "?") {
			required++
		}
	}
	switch {
	case len(pos) < required:
		return env.argError(fs, "missing %s", names[len(pos)]), false
	case len(pos) > len(names):
		return env.argError(fs, "unexpected argument %q", pos[len(names)]), false
	}
	return exitOK, true
}

// argError prints a usage error of fs's command on one line, with a hint
// to its help, and returns exitUsage.
func (env *cli) argError(fs *flag.FlagSet, format string, args ...any) int {
	fmt.Fprintf(env.stderr, "rlpipe %s: %s (see 'rlpipe %s -h')\n", fs.Name(), fmt.Sprintf(format, args...), fs.Name())
	return exitUsage
}
