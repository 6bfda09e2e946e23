#include "dlprobe/core/batch_search.h"

#include <algorithm>
#include <limits>

namespace dlprobe {

namespace {

BatchSearchOptions within_bounds(BatchSearchOptions o) {
  const std::int64_t g = o.granularity = std::max<std::int64_t>(o.granularity, 1);
  // Rounded up to a multiple of the granularity; near the top of the range, where none above fits,
  // down.
  const auto up = [g](std::int64_t v) {
    const std::int64_t down = v / g * g;
    return down == v || down > std::numeric_limits<std::int64_t>::max() - g ? down : down + g;
  };
  o.lower = up(std::max<std::int64_t>(o.lower, 1));
  o.upper = std::max(o.upper / g * g, o.lower);
  o.guess = std::clamp(up(std::max<std::int64_t>(o.guess, 1)), o.lower, o.upper);
  o.first_step = up(std::max<std::int64_t>(o.first_step, 1));
  return o;
}

}  // namespace

BatchSearch::BatchSearch(const BatchSearchOptions& options)
    : o_(within_bounds(options)), step_(o_.first_step) {}

std::optional<std::int64_t> BatchSearch::next() const {
  if (o_.max_probes && probes_ >= *o_.max_probes) return std::nullopt;
  if (!passed_ && !failed_) return o_.guess;
  if (!failed_) {
    // Walking up; written so that it cannot overflow near the top of the range.
    if (*passed_ >= o_.upper) return std::nullopt;
    return o_.upper - *passed_ <= step_ ? o_.upper : *passed_ + step_;
  }
  if (!passed_) {
    if (*failed_ <= o_.lower) return std::nullopt;
    return *failed_ - o_.lower <= step_ ? o_.lower : *failed_ - step_;
  }
  const std::int64_t lo = *passed_;
  const std::int64_t hi = *failed_;
  if (hi - lo <= o_.granularity) return std::nullopt;
  std::int64_t mid = (lo + (hi - lo) / 2) / o_.granularity * o_.granularity;
  if (mid <= lo) mid = lo + o_.granularity;
  // lo + granularity < hi here, so mid stays below hi.
  return mid;
}

void BatchSearch::report(std::int64_t batch, bool passed) {
  // A probe of the walk (exactly one side known before it) makes the next step twice as long.
  if (passed_.has_value() != failed_.has_value()) {
    // A step of `upper` reaches either bound from anywhere, so it is as long as one needs to be.
    step_ = step_ > o_.upper / 2 ? o_.upper : step_ * 2;
  }
  ++probes_;
  if (passed) {
    if (!passed_ || batch > *passed_) passed_ = batch;
  } else if (!failed_ || batch < *failed_) {
    failed_ = batch;
  }
}

bool BatchSearch::converged() const {
  if (!passed_) return false;
  if (!failed_) return *passed_ >= o_.upper;
  return *failed_ - *passed_ <= o_.granularity;
}

}  // namespace dlprobe
