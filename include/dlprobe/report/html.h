// `dlprobe report`: one self-contained HTML file from one or more results files. Everything is
// inline (CSS, SVG charts drawn here, a few lines of script to sort the table); the page fetches
// nothing, so it can be mailed, attached to a ticket or opened offline.
//
// Charts, each an <svg> with a stable id (tests look them up): throughput vs batch per precision
// with CI error bars (chart-throughput), inference latency vs batch (chart-latency, median with a
// bar from the fastest step to p99, when a native run has mode infer), step-time distributions
// (chart-step-times), peak memory by category (chart-memory, when any configuration has memory
// figures), memory over one step per `dlprobe memory` configuration (chart-memory-timeline-N),
// and GPU utilisation, power
// and SM clock over time (chart-gpu-util, chart-power, chart-sm-clock, when any configuration
// carries a telemetry timeline). Then the environment of each file, warnings and findings, and the
// sortable table of every configuration (table id "configurations").
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "dlprobe/results/table.h"

namespace dlprobe::report {

// & < > " ' as entities: safe in element text and in quoted attribute values, HTML and SVG alike.
std::string html_escape(std::string_view text);

std::string render_html(std::span<const results::NamedDocument> documents);

}  // namespace dlprobe::report
