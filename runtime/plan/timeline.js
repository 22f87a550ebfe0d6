// The timeline's script: a tooltip for the op under the pointer, and a
// check that the picture adds up. It marks its section data-ready="1"
// when it ran, data-check with the outcome of the check, and data-error
// (shown on the page too) when anything failed.
(function () {
  "use strict";
  var root = document.currentScript.closest("section.rlp-tl");
  function fail(msg) {
    root.dataset.error = msg;
    var p = root.querySelector(".rlp-error");
    p.textContent = "timeline script: " + msg;
    p.hidden = false;
  }
  try {
    var d = JSON.parse(root.querySelector("script.rlp-data").textContent);
    var n = d.ops.length;
    // The check: every op's categories add up to its total, the peak is
    // the largest total, and every category has its area.
    var bad = -1, peak = 0;
    for (var i = 0; i < n; i++) {
      var sum = 0;
      for (var k = 0; k < d.kinds.length; k++) sum += d.bytes[k][i];
      if (sum !== d.total[i] && bad < 0) bad = i;
      if (d.total[i] > peak) peak = d.total[i];
    }
    var areas = root.querySelectorAll("path.rlp-area").length;
    root.dataset.areas = String(areas);
    root.dataset.ops = String(n);
    if (bad >= 0) {
      root.dataset.check = "op " + bad + ": categories do not add up to the total";
    } else if (n > 0 && peak !== d.peak) {
      root.dataset.check = "the peak is not the largest total";
    } else if (areas !== d.kinds.length) {
      root.dataset.check = areas + " areas for " + d.kinds.length + " categories";
    } else {
      root.dataset.check = "ok";
    }
    if (root.dataset.check !== "ok") fail(root.dataset.check);
    var svg = root.querySelector("svg.rlp-svg");
    if (n > 0 && svg) hover(d, svg);
    root.dataset.ready = "1";
  } catch (e) {
    fail(String(e && e.message || e));
  }

  // fmt formats bytes as the page does: GiB, MiB or KiB, whichever is
  // the largest below them, with two decimals.
  function fmt(b) {
    var units = [["GiB", 1073741824], ["MiB", 1048576], ["KiB", 1024]];
    for (var u = 0; u < units.length; u++) {
      if (Math.abs(b) >= units[u][1]) return (b / units[u][1]).toFixed(2) + " " + units[u][0];
    }
    return b + " B";
  }

  // pct100 formats 100·n/of as the page does.
  function pct100(n, of) {
    var v = 100 * n / of;
    return v >= 1 ? v.toFixed(1) : String(Number(v.toPrecision(2)));
  }

  function cell(tr, text, cls) {
    var td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  // hover shows, for the op under the pointer, its name, stage and
  // bytes by category. A page address ending in #op=N shows op N so.
  function hover(d, svg) {
    var tip = root.querySelector(".rlp-tip");
    var cursor = svg.querySelector("line.cursor");
    var area = svg.querySelector("rect.hover");
    var chart = root.querySelector(".rlp-chart");
    function show(i, clientX, clientY) {
      var s = d.stages[d.stage[i]] || { id: "?", kind: "?", phase: "?" };
      var cx = d.x0 + (d.x1 - d.x0) * (i + 0.5) / n;
      cursor.setAttribute("x1", cx);
      cursor.setAttribute("x2", cx);
      cursor.setAttribute("visibility", "visible");
      tip.textContent = "";
      var head = document.createElement("div");
      var b = document.createElement("b");
      b.textContent = "op " + i + ": " + d.ops[i];
      head.appendChild(b);
      tip.appendChild(head);
      var sub = document.createElement("div");
      sub.textContent = "stage " + s.id + " (" + s.kind + "), " + s.phase;
      tip.appendChild(sub);
      var table = document.createElement("table");
      for (var k = d.kinds.length - 1; k >= 0; k--) {
        var v = d.bytes[k][i];
        if (v === 0) continue;
        var tr = document.createElement("tr");
        cell(tr, "\u25A0").style.color = d.colors[k];
        cell(tr, d.kinds[k]);
        cell(tr, fmt(v), "n");
        table.appendChild(tr);
      }
      var tot = document.createElement("tr");
      cell(tot, "");
      cell(tot, "total").style.fontWeight = "600";
      cell(tot, fmt(d.total[i]), "n").style.fontWeight = "600";
      table.appendChild(tot);
      if (d.budget > 0) {
        var pct = document.createElement("tr");
        cell(pct, "");
        cell(pct, "of the budget");
        cell(pct, pct100(d.total[i], d.budget) + " %", "n");
        table.appendChild(pct);
      }
      tip.appendChild(table);
      tip.hidden = false;
      var cr = chart.getBoundingClientRect();
      var left = clientX - cr.left + 14;
      if (left + tip.offsetWidth > cr.width) left = clientX - cr.left - tip.offsetWidth - 14;
      tip.style.left = Math.max(0, left) + "px";
      // Below the pointer, clear of the peak's label above the stack.
      var top = clientY - cr.top + 18;
      if (top + tip.offsetHeight > cr.height) top = cr.height - tip.offsetHeight;
      tip.style.top = Math.max(0, top) + "px";
      root.dataset.shown = String(i);
    }
    area.addEventListener("mousemove", function (ev) {
      var r = svg.getBoundingClientRect();
      var x = (ev.clientX - r.left) * d.width / r.width;
      var i = Math.floor((x - d.x0) / (d.x1 - d.x0) * n);
      show(Math.max(0, Math.min(n - 1, i)), ev.clientX, ev.clientY);
    });
    area.addEventListener("mouseleave", function () {
      tip.hidden = true;
      cursor.setAttribute("visibility", "hidden");
    });
    var m = /(?:^#|&)op=(\d+)/.exec(location.hash);
    if (m && +m[1] < n) {
      var i = +m[1];
      var r = svg.getBoundingClientRect();
      var scale = r.width / d.width;
      var y = d.y1 - (d.y1 - d.y0) * d.total[i] / d.ymax;
      show(i, r.left + (d.x0 + (d.x1 - d.x0) * (i + 0.5) / n) * scale, r.top + y * scale);
    }
  }
})();
