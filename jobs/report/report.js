// The report's script: a tooltip on every chart with the values at the
// step under the pointer. It marks the page data-ready="1" when it ran,
// with data-charts and data-series counting what it found drawn, and
// data-error (shown on the page too) when anything failed.
(function () {
  "use strict";
  var root = document.querySelector("main.rlp-report");
  function fail(msg) {
    root.dataset.error = msg;
    var p = root.querySelector("p.error");
    p.textContent = "report script: " + msg;
    p.hidden = false;
  }
  var units = [["GiB", 1073741824], ["MiB", 1048576], ["KiB", 1024]];
  function fmt(v, format) {
    if (v === null) return "not a number";
    if (format === "bytes") {
      for (var u = 0; u < units.length; u++) {
        if (Math.abs(v) >= units[u][1]) return (v / units[u][1]).toFixed(2) + " " + units[u][0];
      }
      return v + " B";
    }
    return String(Number(v.toPrecision(4)));
  }
  try {
    var data = JSON.parse(document.getElementById("rlp-report-data").textContent);
    var series = 0, drawn = 0;
    data.charts.forEach(function (c) {
      var fig = root.querySelector('figure[data-chart="' + c.id + '"]');
      if (!fig) throw new Error("chart " + c.id + " is not on the page");
      if (+fig.dataset.series !== c.series.length) throw new Error("chart " + c.id + ": " + fig.dataset.series + " series drawn, " + c.series.length + " in the data");
      series += c.series.length;
      drawn += fig.querySelectorAll("path.series, circle.dot").length > 0 ? 1 : 0;
      hover(c, fig);
    });
    root.dataset.charts = String(data.charts.length);
    root.dataset.drawn = String(drawn);
    root.dataset.series = String(series);
    root.dataset.ready = "1";
  } catch (e) {
    fail(String(e && e.message || e));
  }

  // hover shows, for the step under the pointer, every series' value at
  // the point nearest to it.
  function hover(c, fig) {
    var svg = fig.querySelector("svg");
    var area = svg.querySelector("rect.hover");
    var cursor = svg.querySelector("line.cursor");
    var tip = fig.querySelector(".tip");
    var plot = fig.querySelector(".plot");
    area.addEventListener("mousemove", function (ev) {
      var r = svg.getBoundingClientRect();
      var sx = (ev.clientX - r.left) * c.width / r.width;
      var x = c.xmin + (sx - c.x0) / (c.x1 - c.x0) * (c.xmax - c.xmin);
      tip.textContent = "";
      var table = document.createElement("table");
      var at = null;
      c.series.forEach(function (s) {
        var best = null;
        s.points.forEach(function (p) {
          if (best === null || Math.abs(p[0] - x) < Math.abs(best[0] - x)) best = p;
        });
        if (best === null) return;
        if (at === null || Math.abs(best[0] - x) < Math.abs(at[0] - x)) at = best;
        var tr = document.createElement("tr");
        [["\u25A0", s.color], [s.name], [fmt(best[1], c.format)],
          [best[3] ? "step " + best[2] + ", update " + best[3] : "step " + best[2]]].forEach(function (t) {
          var td = document.createElement("td");
          td.textContent = t[0];
          if (t[1]) td.style.color = t[1];
          tr.appendChild(td);
        });
        table.appendChild(tr);
      });
      if (at === null) return;
      var cx = c.x0 + (at[0] - c.xmin) / (c.xmax - c.xmin) * (c.x1 - c.x0);
      cursor.setAttribute("x1", cx);
      cursor.setAttribute("x2", cx);
      cursor.setAttribute("visibility", "visible");
      tip.appendChild(table);
      tip.hidden = false;
      var pr = plot.getBoundingClientRect();
      var left = ev.clientX - pr.left + 12;
      if (left + tip.offsetWidth > pr.width) left = ev.clientX - pr.left - tip.offsetWidth - 12;
      tip.style.left = Math.max(0, left) + "px";
      tip.style.top = Math.max(0, ev.clientY - pr.top - tip.offsetHeight - 8) + "px";
    });
    area.addEventListener("mouseleave", function () {
      tip.hidden = true;
      cursor.setAttribute("visibility", "hidden");
    });
  }
})();
