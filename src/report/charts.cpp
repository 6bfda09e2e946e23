#include "charts.h"

#include <fmt/format.h>

#include <cmath>
#include <iterator>

#include "dlprobe/report/html.h"

namespace dlprobe::report {

namespace {

// The style of the report and of the trend page.
constexpr std::string_view kStyle = R"(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h3 { font-size: 15px; }
.sub { color: #666; margin-top: 0; }
.chart-box { position: relative; max-width: 1100px; margin: 8px 0 16px; }
table { border-collapse: collapse; margin: 8px 0; max-width: 100%; }
.wide { overflow-x: auto; max-width: 100%; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
table.sortable th { cursor: pointer; background: #f4f4f4; user-select: none; }
table.sortable th[data-order="asc"]::after { content: " \25B2"; }
table.sortable th[data-order="desc"]::after { content: " \25BC"; }
table.kv th { background: #f8f8f8; width: 220px; }
#machines th { white-space: pre-line; }
tr.sev-error td:first-child { color: #b00020; font-weight: bold; }
tr.sev-warning td:first-child { color: #a65e00; font-weight: bold; }
.none { color: #777; }
)";

// Eleven: the memory chart's categories, a planned arena's four parts among them, each its own.
constexpr const char* kPalette[] = {"#0072B2", "#E69F00", "#009E73", "#D55E00",
                                    "#CC79A7", "#56B4E9", "#F0E442", "#000000",
                                    "#7f3c8d", "#11a579", "#e73f74"};

// Creates the charts the JSON of #chart-data describes. Besides Chart.js's configuration, a
// specification may carry: dataset.tips[i], the tooltip text of point i; dataset.title, the
// tooltip's title; dataset.group with dataset.legend, GPUs whose lines are split by configuration
// (one legend entry per group, a click shows or hides the whole group); and on the specification
// errorBars (points' low and high drawn as bars), bands (shaded x ranges with a label) and
// markers (dashed vertical lines with a label), which Chart.js does not draw.
//
// Zoom: drag across a chart to show that x range, double-click to return to the whole. It is
// written here on the x scale's min and max because Debian packages no chartjs-plugin-zoom, and
// the page may load nothing from elsewhere.
constexpr std::string_view kChartScript = R"(
(function () {
  'use strict';
  var specs = JSON.parse(document.getElementById('chart-data').textContent);
  var extras = {};
  Chart.defaults.animation = false;
  Chart.defaults.maintainAspectRatio = false;
  Chart.defaults.font.family = 'system-ui, -apple-system, "Segoe UI", sans-serif';

  function extra(chart) { return extras[chart.canvas.id] || {}; }
  function clip(ctx, a) {
    ctx.beginPath();
    ctx.rect(a.left, a.top, a.right - a.left, a.bottom - a.top);
    ctx.clip();
  }
  var errorBars = {
    id: 'dlprobeErrorBars',
    afterDatasetsDraw: function (chart) {
      if (!extra(chart).errorBars) return;
      var ctx = chart.ctx, y = chart.scales.y;
      ctx.save();
      clip(ctx, chart.chartArea);
      chart.data.datasets.forEach(function (d, i) {
        if (!chart.isDatasetVisible(i)) return;
        chart.getDatasetMeta(i).data.forEach(function (point, k) {
          var raw = d.data[k];
          if (!raw || typeof raw.low !== 'number' || typeof raw.high !== 'number') return;
          var lo = y.getPixelForValue(raw.low), hi = y.getPixelForValue(raw.high);
          ctx.strokeStyle = d.borderColor;
          ctx.lineWidth = 1.5;
          ctx.beginPath();
          ctx.moveTo(point.x, lo); ctx.lineTo(point.x, hi);
          ctx.moveTo(point.x - 5, lo); ctx.lineTo(point.x + 5, lo);
          ctx.moveTo(point.x - 5, hi); ctx.lineTo(point.x + 5, hi);
          ctx.stroke();
        });
      });
      ctx.restore();
    }
  };
  var bands = {
    id: 'dlprobeBands',
    beforeDatasetsDraw: function (chart) {
      var list = extra(chart).bands;
      if (!list) return;
      var ctx = chart.ctx, x = chart.scales.x, a = chart.chartArea;
      ctx.save();
      clip(ctx, a);
      ctx.font = '11px sans-serif';
      list.forEach(function (b) {
        var x0 = Math.max(x.getPixelForValue(b.from), a.left);
        var x1 = Math.min(x.getPixelForValue(b.to), a.right);
        if (!(x1 > x0)) return;
        ctx.fillStyle = b.fill;
        ctx.fillRect(x0, a.top, x1 - x0, a.bottom - a.top);
        if (b.label && x1 - x0 >= ctx.measureText(b.label).width + 6) {
          ctx.fillStyle = '#555';
          ctx.fillText(b.label, x0 + 3, a.top + 12);
        }
      });
      ctx.restore();
    }
  };
  var markers = {
    id: 'dlprobeMarkers',
    afterDatasetsDraw: function (chart) {
      var list = extra(chart).markers;
      if (!list) return;
      var ctx = chart.ctx, x = chart.scales.x, a = chart.chartArea;
      ctx.save();
      clip(ctx, a);
      ctx.font = '11px sans-serif';
      list.forEach(function (m) {
        var px = x.getPixelForValue(m.x);
        ctx.strokeStyle = ctx.fillStyle = m.colour;
        ctx.setLineDash([4, 3]);
        ctx.beginPath(); ctx.moveTo(px, a.top); ctx.lineTo(px, a.bottom); ctx.stroke();
        var right = px > (a.left + a.right) / 2;
        ctx.textAlign = right ? 'right' : 'left';
        ctx.fillText(m.label, px + (right ? -4 : 4), a.top + 26);
      });
      ctx.restore();
    }
  };
  var selection = {
    id: 'dlprobeSelection',
    afterDraw: function (chart) {
      var s = chart.$dlprobeDrag;
      if (!s || s.to === null) return;
      var a = chart.chartArea, ctx = chart.ctx;
      ctx.save();
      ctx.fillStyle = 'rgba(0, 114, 178, 0.15)';
      ctx.fillRect(Math.min(s.from, s.to), a.top, Math.abs(s.to - s.from), a.bottom - a.top);
      ctx.restore();
    }
  };

  function zoomable(chart) {
    // Chart.js rebuilds options.scales on every update: it is looked up each time, not kept.
    function scale() { return chart.config.options.scales.x; }
    var canvas = chart.canvas, whole = { min: scale().min, max: scale().max };
    function inside(e) {
      var a = chart.chartArea;
      return Math.min(Math.max(e.offsetX, a.left), a.right);
    }
    canvas.addEventListener('mousedown', function (e) {
      var a = chart.chartArea;
      if (e.button !== 0 || e.offsetX < a.left || e.offsetX > a.right) return;
      chart.$dlprobeDrag = { from: e.offsetX, to: null };
    });
    canvas.addEventListener('mousemove', function (e) {
      if (!chart.$dlprobeDrag) return;
      chart.$dlprobeDrag.to = inside(e);
      chart.draw();
    });
    function end(e) {
      var s = chart.$dlprobeDrag;
      chart.$dlprobeDrag = null;
      if (!s) return;
      var to = inside(e);
      if (Math.abs(to - s.from) < 5) { chart.draw(); return; }
      var x = chart.scales.x;
      var lo = x.getValueForPixel(Math.min(s.from, to)), hi = x.getValueForPixel(Math.max(s.from, to));
      if (x.type === 'category') { lo = Math.round(lo); hi = Math.round(hi); }
      scale().min = lo;
      scale().max = hi;
      chart.update('none');
      canvas.setAttribute('data-zoomed', 'true');
    }
    canvas.addEventListener('mouseup', end);
    canvas.addEventListener('mouseleave', function (e) { if (chart.$dlprobeDrag) end(e); });
    canvas.addEventListener('dblclick', function () {
      scale().min = whole.min;
      scale().max = whole.max;
      chart.update('none');
      canvas.removeAttribute('data-zoomed');
    });
  }

  var defaults = Chart.defaults.plugins.tooltip.callbacks;
  specs.forEach(function (spec) {
    var canvas = document.getElementById(spec.id);
    if (!canvas) return;
    extras[spec.id] = spec;
    var config = spec.config, plugins = config.options.plugins;
    plugins.tooltip = plugins.tooltip || {};
    plugins.tooltip.callbacks = {
      title: function (items) {
        var d = items.length ? items[0].dataset : null;
        if (spec.titles && items.length) return spec.titles[items[0].dataIndex];
        if (d && d.title) return d.title;
        return defaults.title.apply(this, arguments);
      },
      label: function (item) {
        var tips = item.dataset.tips;
        if (tips && typeof tips[item.dataIndex] === 'string') return tips[item.dataIndex];
        var text = defaults.label.call(this, item);
        return spec.unit ? text + ' ' + spec.unit : text;
      }
    };
    plugins.legend = plugins.legend || {};
    plugins.legend.labels = {
      filter: function (item, data) { return data.datasets[item.datasetIndex].legend !== false; }
    };
    plugins.legend.onClick = function (e, item, legend) {
      var chart = legend.chart, group = chart.data.datasets[item.datasetIndex].group;
      var show = !chart.isDatasetVisible(item.datasetIndex);
      chart.data.datasets.forEach(function (d, i) {
        if (i === item.datasetIndex || (group !== undefined && d.group === group)) {
          chart.setDatasetVisibility(i, show);
        }
      });
      chart.update();
    };
    if (spec.dates) {
      config.options.scales.x.ticks = {
        // Within ten days the hour tells two runs of a day apart.
        callback: function (v) {
          var t = new Date(v).toISOString();
          return this.max - this.min < 864e6 ? t.slice(0, 16).replace('T', ' ') : t.slice(0, 10);
        }
      };
    }
    config.plugins = [bands, errorBars, markers, selection];
    zoomable(new Chart(canvas, config));
  });
})();
)";

}  // namespace

std::string_view page_style() {
  return kStyle;
}

const char* chart_colour(std::size_t i) {
  return kPalette[i % std::size(kPalette)];
}

std::string chart_canvas(std::string_view id, std::string_view title, int height) {
  return fmt::format(
      "<div class=\"chart-box\" style=\"height: {}px\"><canvas id=\"{}\" class=\"chart\" "
      "role=\"img\" aria-label=\"{}\">{}</canvas></div>\n",
      height, html_escape(id), html_escape(title), html_escape(title));
}

nlohmann::json chart_spec(std::string_view id, std::string_view type, std::string_view title,
                          std::string_view unit) {
  nlohmann::json options = {
      {"responsive", true},
      {"plugins",
       {{"title", {{"display", true}, {"text", title}, {"font", {{"size", 14}}}}},
        {"subtitle",
         {{"display", true},
          {"text", "drag across to zoom, double-click to see all"},
          {"color", "#888"},
          {"padding", {{"bottom", 6}}}}}}},
      {"scales", {{"x", nlohmann::json::object()}, {"y", nlohmann::json::object()}}},
  };
  return {{"id", id},
          {"unit", unit},
          {"config",
           {{"type", type},
            {"data", {{"datasets", nlohmann::json::array()}}},
            {"options", std::move(options)}}}};
}

nlohmann::json axis_title(std::string_view text) {
  return {{"display", true}, {"text", text}};
}

std::string script_json(const nlohmann::json& value) {
  // Invalid UTF-8 (a label cut inside a character, a hand-edited file) is replaced rather than
  // thrown on: the page must still be written.
  const std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    if (ch == '<') {
      out += "\\u003c";  // only inside strings, where JSON allows the escape
    } else {
      out += ch;
    }
  }
  return out;
}

std::string chart_scripts(const nlohmann::json& charts) {
  if (charts.empty()) return "";
  std::string s = "<script type=\"application/json\" id=\"chart-data\">";
  s += script_json(charts);
  s += "</script>\n<script>";
  s += chartjs_source();
  s += "</script>\n<script>";
  s += kChartScript;
  s += "</script>\n";
  return s;
}

TimeUnit time_unit(double seconds) {
  if (std::isfinite(seconds) && seconds >= 1) return {"s", 1};
  if (std::isfinite(seconds) && seconds > 0 && seconds < 1e-3) return {"µs", 1e6};
  return {"ms", 1e3};
}

}  // namespace dlprobe::report
