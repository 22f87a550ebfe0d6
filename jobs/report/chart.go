package report

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/rlpipe/rlpipe/runtime/plan"
)

// point is one value of a series: at X on the step axis, for the step
// (and the update, 0 on a step line) it was measured at.
type point struct {
	X, Y   float64
	Step   int
	Update int
}

// series is one line of a chart.
type series struct {
	Name   string
	Color  string
	Points []point
	Dashed bool // a planned figure, drawn dashed
}

// chart is one line chart of the page, and, once laid out, what its SVG
// draws.
type chart struct {
	ID, Title, Note, Source string
	// Format is how values read: "num", or "bytes".
	Format string
	// FromZero puts 0 on the y axis.
	FromZero bool
	Series   []series

	laid   bool
	xmin   float64
	xmax   float64
	ymin   float64
	ymax   float64
	Paths  []svgPath
	Dots   []svgDot
	YTicks []svgTick
	XTicks []svgTick
	Marks  []svgTick // values that are not numbers (NaN, ±Inf), at their x
	Legend []legendEntry
	Notes  []string
	Frame  chartFrame
}

// chartFrame is the geometry of a chart as the template writes it: the
// SVG's size, the plot area's edges, and where the axes' labels go.
type chartFrame struct {
	W, H, L, R, T, B, PlotW, PlotH string
	TickX, TickY, NameY, MarkY     string
}

// frame is the geometry every chart shares.
var frame = chartFrame{W: coord(chWidth), H: coord(chHeight), L: coord(chLeft), R: coord(chRight), T: coord(chTop), B: coord(chBottom),
	PlotW: coord(chRight - chLeft), PlotH: coord(chBottom - chTop), TickX: coord(chLeft - 6), TickY: coord(chBottom + 15),
	NameY: coord(chHeight - 4), MarkY: coord(chTop + 10)}

// The geometry of a chart, in SVG user units.
const (
	chWidth  = 420.0
	chHeight = 214.0
	chLeft   = 58.0
	chRight  = 410.0
	chTop    = 14.0
	chBottom = 180.0
)

// svgPath is a series' line, or a stretch of it between values that are
// not numbers.
type svgPath struct {
	D, Color string
	Dashed   bool
}

// svgDot marks one point of a series.
type svgDot struct {
	X, Y, Color string
}

// svgTick is an axis tick (or a mark) at Pos, with its text.
type svgTick struct {
	Pos, Text string
}

// legendEntry names a series in the chart's legend, with its last value.
type legendEntry struct {
	Name, Color, Last string
	Dashed            bool
}

// coord formats a coordinate with one decimal.
func coord(v float64) string {
	return strings.TrimSuffix(strconv.FormatFloat(math.Round(v*10)/10, 'f', 1, 64), ".0")
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// x and y map a value to the chart's coordinates.
func (c *chart) x(v float64) float64 {
	return chLeft + (chRight-chLeft)*(v-c.xmin)/(c.xmax-c.xmin)
}

func (c *chart) y(v float64) float64 {
	return chBottom - (chBottom-chTop)*(v-c.ymin)/(c.ymax-c.ymin)
}

// layout computes the chart's scales and what its SVG draws. Values that
// are not numbers break their line and are marked at the top of the
// chart; a series of one point is drawn as a dot.
func (c *chart) layout() *chart {
	if c.laid {
		return c
	}
	c.laid = true
	c.Frame = frame
	c.xmin, c.xmax = math.Inf(1), math.Inf(-1)
	c.ymin, c.ymax = math.Inf(1), math.Inf(-1)
	for _, s := range c.Series {
		for _, p := range s.Points {
			c.xmin, c.xmax = math.Min(c.xmin, p.X), math.Max(c.xmax, p.X)
			if finite(p.Y) {
				c.ymin, c.ymax = math.Min(c.ymin, p.Y), math.Max(c.ymax, p.Y)
			}
		}
	}
	if c.xmin > c.xmax {
		c.xmin, c.xmax = 0, 1
	}
	if c.xmin == c.xmax {
		c.xmin, c.xmax = c.xmin-0.5, c.xmax+0.5
	}
	if c.ymin > c.ymax {
		c.ymin, c.ymax = 0, 1
	}
	if c.FromZero {
		c.ymin = math.Min(c.ymin, 0)
	}
	switch span := c.ymax - c.ymin; {
	case span == 0 && c.ymin == 0:
		c.ymin, c.ymax = -1, 1
	case span == 0:
		pad := math.Abs(c.ymin) * 0.1
		c.ymin, c.ymax = c.ymin-pad, c.ymax+pad
	default:
		c.ymax += span * 0.06
		if !c.FromZero || c.ymin < 0 {
			c.ymin -= span * 0.06
		}
	}
	many := 0
	for _, s := range c.Series {
		many = max(many, len(s.Points))
	}
	for _, s := range c.Series {
		c.drawSeries(s, many <= 60)
	}
	c.YTicks = c.yTicks()
	c.XTicks = c.xTicks()
	return c
}

// drawSeries adds the paths, dots, marks, legend entry and notes of s.
func (c *chart) drawSeries(s series, dots bool) {
	var b strings.Builder
	run := 0 // points in the current stretch of numbers
	var bad []string
	for i, p := range s.Points {
		if !finite(p.Y) {
			c.Marks = append(c.Marks, svgTick{Pos: coord(c.x(p.X)), Text: strconv.FormatFloat(p.Y, 'g', -1, 64)})
			bad = append(bad, fmt.Sprintf("%v at %s", p.Y, where(p)))
			run = 0
			continue
		}
		x, y := coord(c.x(p.X)), coord(c.y(p.Y))
		if run == 0 {
			fmt.Fprintf(&b, "M%s %s", x, y)
		} else {
			fmt.Fprintf(&b, "L%s %s", x, y)
		}
		run++
		next := i+1 < len(s.Points) && finite(s.Points[i+1].Y)
		if dots || (run == 1 && !next) {
			c.Dots = append(c.Dots, svgDot{X: x, Y: y, Color: s.Color})
		}
	}
	if b.Len() > 0 {
		c.Paths = append(c.Paths, svgPath{D: b.String(), Color: s.Color, Dashed: s.Dashed})
	}
	last := "-"
	if n := len(s.Points); n > 0 {
		last = c.format(s.Points[n-1].Y)
	}
	c.Legend = append(c.Legend, legendEntry{Name: s.Name, Color: s.Color, Last: last, Dashed: s.Dashed})
	if len(bad) > 0 {
		if len(bad) > 4 {
			bad = append(bad[:4], fmt.Sprintf("and %d more", len(bad)-4))
		}
		c.Notes = append(c.Notes, fmt.Sprintf("%s: %s, not drawn (marked at the top)", s.Name, strings.Join(bad, ", ")))
	}
}

// where says which step (and update) a point is of.
func where(p point) string {
	if p.Update > 0 {
		return fmt.Sprintf("step %d (update %d)", p.Step, p.Update)
	}
	return fmt.Sprintf("step %d", p.Step)
}

// format formats a value of the chart.
func (c *chart) format(v float64) string {
	if !finite(v) {
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	if c.Format == "bytes" {
		return plan.Bytes(int64(v))
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

// roundStep returns 1, 2 or 5 times a power of ten, the first at least
// span/parts.
func roundStep(span float64, parts int) float64 {
	want := span / float64(parts)
	mag := math.Pow(10, math.Floor(math.Log10(want)))
	step := 10 * mag
	for _, f := range []float64{5, 2, 1} {
		if f*mag >= want {
			step = f * mag
		}
	}
	return step
}

// yTicks returns about five ticks on the y axis, at round values (in the
// bytes unit of the largest value for a bytes chart).
func (c *chart) yTicks() []svgTick {
	scale, suffix := 1.0, ""
	if c.Format == "bytes" {
		for _, u := range []struct {
			name  string
			bytes float64
		}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
			if math.Max(math.Abs(c.ymax), math.Abs(c.ymin)) >= u.bytes {
				scale, suffix = u.bytes, " "+u.name
				break
			}
		}
	}
	lo, hi := c.ymin/scale, c.ymax/scale
	step := roundStep(hi-lo, 5)
	decimals := max(0, int(-math.Floor(math.Log10(step))))
	// Very small or large values read in exponent form, with the digits
	// the step needs.
	big := math.Max(math.Abs(lo), math.Abs(hi))
	exp := c.Format != "bytes" && (big < 1e-3 || big >= 1e6)
	expDigits := max(0, int(-math.Floor(math.Log10(step/math.Pow(10, math.Floor(math.Log10(big)))))))
	var ts []svgTick
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step {
		text := strconv.FormatFloat(v, 'f', decimals, 64)
		if exp {
			text = strconv.FormatFloat(v, 'e', expDigits, 64)
		}
		if math.Abs(v) < step*1e-9 {
			text = "0"
		}
		ts = append(ts, svgTick{Pos: coord(c.y(v * scale)), Text: text + suffix})
	}
	return ts
}

// xTicks returns ticks at whole steps.
func (c *chart) xTicks() []svgTick {
	step := math.Max(1, roundStep(c.xmax-c.xmin, 8))
	var ts []svgTick
	for v := math.Ceil(c.xmin/step) * step; v <= c.xmax+1e-9; v += step {
		ts = append(ts, svgTick{Pos: coord(c.x(v)), Text: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	return ts
}

// chartData is a chart as the page's script reads it.
type chartData struct {
	ID     string       `json:"id"`
	Format string       `json:"format"`
	Series []seriesData `json:"series"`
	// The frame: the x domain [XMin, XMax] spans X0 to X1 of the SVG,
	// whose width is Width.
	XMin  float64 `json:"xmin"`
	XMax  float64 `json:"xmax"`
	X0    float64 `json:"x0"`
	X1    float64 `json:"x1"`
	Width float64 `json:"width"`
}

// seriesData is a series as the page's script reads it.
type seriesData struct {
	Name  string `json:"name"`
	Color string `json:"color"`
	// Points are [x, y, step, update], y null where it is not a number.
	Points [][4]any `json:"points"`
}

// data returns what the script needs of the chart.
func (c *chart) data() chartData {
	c.layout()
	d := chartData{ID: c.ID, Format: c.Format, XMin: c.xmin, XMax: c.xmax, X0: chLeft, X1: chRight, Width: chWidth, Series: []seriesData{}}
	for _, s := range c.Series {
		sd := seriesData{Name: s.Name, Color: s.Color, Points: [][4]any{}}
		for _, p := range s.Points {
			var y any
			if finite(p.Y) {
				y = p.Y
			}
			sd.Points = append(sd.Points, [4]any{p.X, y, p.Step, p.Update})
		}
		d.Series = append(d.Series, sd)
	}
	return d
}
