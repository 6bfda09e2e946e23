// `dlprobe report`: one self-contained HTML file from one or more results files. Everything is
// inline (CSS, Chart.js and the charts' data as JSON, a few lines of script to sort the table); the
// page fetches nothing, so it can be mailed, attached to a ticket or opened offline.
//
// Charts, each a <canvas> with a stable id (tests look them up) that Chart.js draws in, with values
// on hover and drag-to-zoom: throughput vs batch per precision with CI error bars
// (chart-throughput), the files' machines side by side when they come from more than one
// (chart-machines, beside the table "machines"), inference latency vs batch (chart-latency, median
// with a bar from the fastest step to p99, when a native run has mode infer), step-time
// distributions (chart-step-times), warm-up curves (chart-warmup), peak memory by category
// (chart-memory, when any configuration has memory figures), memory over one step per `dlprobe
// memory` configuration (chart-memory-timeline-N), and GPU utilisation, power and SM clock over
// time (chart-gpu-util, chart-power, chart-sm-clock, when any configuration carries a telemetry
// timeline). Then warnings and findings, the sortable table of every configuration (table id
// "configurations") and the environment of each file.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "dlprobe/results/table.h"

namespace dlprobe::report {

// & < > " ' as entities: safe in element text and in quoted attribute values.
std::string html_escape(std::string_view text);

std::string render_html(std::span<const results::NamedDocument> documents);

}  // namespace dlprobe::report
