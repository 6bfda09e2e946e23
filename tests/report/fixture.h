// SYNTHETIC TEST FIXTURE documents for the report and compare tests (see fixture.cpp). The
// committed files tests/report/fixtures/*.json are these documents serialised; a test checks that
// they still match.
#pragma once

#include "dlprobe/results/results.h"

namespace dlprobe::testing {

// A resnet50 batch sweep in bf16 and fp32 with memory, telemetry and one out-of-memory run.
results::Document synthetic_native_document();
// Two external-command runs with framework-reported memory.
results::Document synthetic_external_document();

}  // namespace dlprobe::testing
