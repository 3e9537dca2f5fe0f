// Tracing: spans record into the thread's tracer, nested spans inherit their task, the bubble is
// idle worker time, and the writers produce JSON and SVG; GPipe records too, and a profiler
// sees every span.
#include "test_util.h"

#include <gpipe/checkpoint.h>
#include <gpipe/pipe.h>
#include <gpipe/schedule/runtime.h>
#include <gpipe/trace.h>

#include <tinyxml2.h>
#include <nlohmann/json.hpp>

#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace gpipe {
namespace trace {
namespace trace_test {
namespace {

TEST(TraceTest, SpansRecordOnlyUnderATracer) {
  Tracer tracer;
  { TraceSpan ignored("forward", 0, 0); }
  EXPECT_TRUE(tracer.events().empty());
  {
    UseTracer use(&tracer, /*worker=*/3, /*step=*/7);
    TraceSpan outer("backward", 2, 5);
    { TraceSpan inner("recompute"); }
  }
  { TraceSpan after("forward", 0, 0); }  // the tracer is gone from this thread again
  const auto events = tracer.events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].name, "recompute");  // the inner span ends first
  EXPECT_EQ(events[0].stage, 2);           // inherited from the enclosing span
  EXPECT_EQ(events[0].microbatch, 5);
  EXPECT_EQ(events[1].name, "backward");
  EXPECT_EQ(events[1].worker, 3);
  EXPECT_EQ(events[1].step, 7);
  EXPECT_LE(events[1].begin_us, events[0].begin_us);
  EXPECT_GE(events[1].end_us, events[0].end_us);
}

TEST(TraceTest, TracerIsPerThread) {
  Tracer tracer;
  UseTracer use(&tracer, 0, 0);
  std::thread([] { TraceSpan other("forward", 1, 1); }).join();
  EXPECT_TRUE(tracer.events().empty());
}

TEST(TraceTest, BubbleFraction) {
  // Two workers, one step of 10 us: worker 0 computes 10 us, worker 1 computes 4 us and
  // receives 6 us (transfers are not compute). Idle: 6 of 20.
  const std::vector<Event> events = {
      {"forward", 0, 0, 0, 0, 0, 6},         {"backward", 0, 0, 0, 0, 6, 10},
      {"recv_activation", 1, 1, 0, 0, 0, 6}, {"forward", 1, 1, 0, 0, 6, 8},
      {"backward", 1, 1, 0, 0, 8, 10},       {"recompute", 1, 1, 0, 0, 8, 9},
  };
  EXPECT_DOUBLE_EQ(bubble_fraction(events), 6.0 / 20.0);
  EXPECT_EQ(bubble_fraction({}), 0.0);
  // A second step, all busy: utilizations of separate steps add up.
  Utilization total = utilization(events);
  total += utilization({{"forward", 0, 0, 0, 1, 20, 30}, {"forward", 1, 1, 0, 1, 20, 30}});
  EXPECT_DOUBLE_EQ(total.busy_us, 14.0 + 20.0);
  EXPECT_DOUBLE_EQ(total.available_us, 20.0 + 20.0);
  EXPECT_DOUBLE_EQ(total.bubble_fraction(), 6.0 / 40.0);
}

TEST(TraceTest, WritersProduceJsonAndSvg) {
  const std::vector<Event> events = {{"forward", 0, 0, 1, 0, 0, 5},
                                     {"odd \"name\" <&>", 1, 1, 1, 0, 5, 9}};
  std::stringstream json;
  write_chrome_trace(events, json);
  const auto trace = nlohmann::json::parse(json.str());
  int complete = 0, metadata = 0;
  for (const auto& e : trace.at("traceEvents")) {
    complete += e.at("ph") == "X";
    metadata += e.at("ph") == "M";
  }
  EXPECT_EQ(complete, 2);
  EXPECT_EQ(metadata, 2);  // one name per worker
  EXPECT_EQ(trace.at("traceEvents").back().at("name"), "odd \"name\" <&>");

  std::stringstream svg;
  write_svg_timeline(events, svg);
  tinyxml2::XMLDocument document;
  ASSERT_EQ(document.Parse(svg.str().c_str()), tinyxml2::XML_SUCCESS) << document.ErrorStr();
  EXPECT_STREQ(document.RootElement()->Name(), "svg");

  std::stringstream empty;
  write_svg_timeline({}, empty);
  EXPECT_EQ(document.Parse(empty.str().c_str()), tinyxml2::XML_SUCCESS);
}

// The trace says where its time 0 lies on the steady clock, so that a record of the same clock
// (a benchmark's, another tool's) can be laid beside it: the tracer's origin, to the microsecond.
TEST(TraceTest, TheChromeTraceGivesItsOriginOnTheSteadyClock) {
  Tracer tracer;
  const auto before = std::chrono::steady_clock::now();
  const double now_us = tracer.now_us();
  const auto after = std::chrono::steady_clock::now();
  const auto us = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
  };
  // now_us() counts from origin(): the origin plus it is the moment it was read.
  EXPECT_GE(us(tracer.origin()) + now_us, us(before) - 1);
  EXPECT_LE(us(tracer.origin()) + now_us, us(after) + 1);

  std::stringstream with, without;
  write_chrome_trace({{"forward", 0, 0, 0, 0, 0, 5}}, with, tracer.origin());
  EXPECT_NEAR(nlohmann::json::parse(with.str()).at("otherData").at("steady_clock_origin_us"),
              us(tracer.origin()), 0.001);
  write_chrome_trace({{"forward", 0, 0, 0, 0, 0, 5}}, without);
  EXPECT_FALSE(nlohmann::json::parse(without.str()).contains("otherData"));

  // Joining a timeline moves the origin to the timeline's.
  const auto origin = before - std::chrono::milliseconds(3);
  tracer.join_timeline(1, origin, 0);
  EXPECT_EQ(tracer.origin(), origin);
}

// The SVG's boxes (titles) and box labels, in document order.
std::pair<std::vector<std::string>, std::vector<std::string>> svg_boxes_and_labels(
    const std::vector<Event>& events) {
  std::stringstream svg;
  write_svg_timeline(events, svg);
  tinyxml2::XMLDocument document;
  EXPECT_EQ(document.Parse(svg.str().c_str()), tinyxml2::XML_SUCCESS) << document.ErrorStr();
  std::vector<std::string> boxes, labels;
  for (auto* e = document.RootElement()->FirstChildElement(); e; e = e->NextSiblingElement()) {
    if (std::string(e->Name()) == "rect" && e->FirstChildElement("title")) {
      boxes.push_back(e->FirstChildElement("title")->GetText());
    } else if (std::string(e->Name()) == "text" && e->GetText()) {
      labels.push_back(e->GetText());
    }
  }
  return {boxes, labels};
}

TEST(TraceTest, SvgDrawsRecomputeOverBackwardAndNamesStages) {
  // As the engines record them: a recompute ends (and is recorded) before its backward does.
  // Worker 0 runs stages 0 and 2, as interleaved schedules do.
  const std::vector<Event> interleaved = {
      {"forward", 0, 0, 3, 0, 0, 100},     {"forward", 0, 2, 3, 0, 100, 200},
      {"recompute", 0, 2, 3, 0, 200, 260}, {"backward", 0, 2, 3, 0, 200, 400},
      {"send", 0, 2, 3, 0, 400, 410},      {"forward", 1, 1, 3, 0, 100, 200}};
  const auto [boxes, labels] = svg_boxes_and_labels(interleaved);
  ASSERT_EQ(boxes.size(), interleaved.size());
  const auto position = [&](const std::string& prefix) {
    return std::find_if(boxes.begin(), boxes.end(),
                        [&](const std::string& b) { return b.rfind(prefix, 0) == 0; }) -
           boxes.begin();
  };
  EXPECT_GT(position("recompute stage 2"), position("backward stage 2"));  // drawn over it
  EXPECT_GT(position("send stage 2"), position("backward stage 2"));
  for (const char* label : {"0:3", "2:3", "1:3", "box labels: stage:micro-batch"}) {
    EXPECT_NE(std::find(labels.begin(), labels.end(), label), labels.end()) << label;
  }

  // One stage per worker: the micro-batch alone.
  const std::vector<Event> one_stage_each = {{"forward", 0, 0, 3, 0, 0, 100},
                                             {"forward", 1, 1, 3, 0, 100, 200}};
  const auto plain_labels = svg_boxes_and_labels(one_stage_each).second;
  EXPECT_EQ(std::count(plain_labels.begin(), plain_labels.end(), "3"), 2);
  EXPECT_NE(std::find(plain_labels.begin(), plain_labels.end(), "box labels: micro-batch"),
            plain_labels.end());
}

// A tracer that joins the ranks' timeline counts from the new origin, moves what it recorded
// with its clock, and gives every event its rank.
TEST(TraceTest, JoiningATimelineMovesTheClockAndNamesTheRank) {
  Tracer tracer;
  EXPECT_EQ(tracer.rank(), 0);
  EXPECT_EQ(tracer.clock_uncertainty_us(), 0);
  tracer.record({"forward", 0, 0, 0, 0, 10, 20});
  // The timeline began 5 ms ago.
  const double before = tracer.now_us();
  tracer.join_timeline(3, std::chrono::steady_clock::now() - std::chrono::milliseconds(5), 42.5);
  const double after = tracer.now_us();
  EXPECT_EQ(tracer.rank(), 3);
  EXPECT_EQ(tracer.clock_uncertainty_us(), 42.5);
  EXPECT_GE(after, 5000.0);
  EXPECT_LT(after, 5000.0 + 1e6);
  // The clock moved by (old origin - new origin), give or take the µs between the reads, and
  // the recorded event with it.
  const double moved = after - before;
  const auto events = tracer.events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].rank, 3);
  EXPECT_NEAR(events[0].begin_us, 10 + moved, 1e3);  // the two reads above are µs apart
  EXPECT_NEAR(events[0].end_us - events[0].begin_us, 10, 1e-6);
  tracer.record({"backward", 0, 0, 0, 0, 30, 40});
  EXPECT_EQ(tracer.events().back().rank, 3);
}

// Events of several ranks: a process per rank in the Chrome trace, a row per rank in the SVG.
TEST(TraceTest, WritersNameTheRanks) {
  Event a{"forward", 0, 0, 0, 0, 0, 5};
  Event b{"forward", 1, 1, 0, 0, 5, 9};
  b.rank = 1;
  std::stringstream json;
  write_chrome_trace({a, b}, json);
  const auto trace = nlohmann::json::parse(json.str());
  std::map<int64_t, std::string> process_names;
  std::set<std::pair<int64_t, int64_t>> tasks;  // (pid, tid)
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("name") == "process_name") {
      process_names[e.at("pid").get<int64_t>()] = e.at("args").at("name");
    }
    if (e.at("ph") == "X") tasks.insert({e.at("pid").get<int64_t>(), e.at("tid").get<int64_t>()});
  }
  EXPECT_EQ(process_names, (std::map<int64_t, std::string>{{0, "rank 0"}, {1, "rank 1"}}));
  EXPECT_EQ(tasks, (std::set<std::pair<int64_t, int64_t>>{{0, 0}, {1, 1}}));
  const auto labels = svg_boxes_and_labels({a, b}).second;
  for (const char* row : {"rank 0", "rank 1"}) {
    EXPECT_NE(std::find(labels.begin(), labels.end(), row), labels.end()) << row;
  }
  // A rank with two workers (threads of one process) names both; one process names no rank.
  Event c = b;
  c.worker = 2;
  const auto two_workers = svg_boxes_and_labels({a, b, c}).second;
  for (const char* row : {"rank 0", "rank 1:1", "rank 1:2"}) {
    EXPECT_NE(std::find(two_workers.begin(), two_workers.end(), row), two_workers.end()) << row;
  }
  // Workers of different ranks are different workers, whatever their numbers.
  Event d = a;
  d.rank = 1;
  EXPECT_DOUBLE_EQ(utilization({a, d}).available_us, 2 * 5.0);
  std::stringstream one_process;
  write_chrome_trace({a}, one_process);
  EXPECT_EQ(one_process.str().find("process_name"), std::string::npos);
  const auto worker_rows = svg_boxes_and_labels({a}).second;
  EXPECT_NE(std::find(worker_rows.begin(), worker_rows.end(), "worker 0"), worker_rows.end());
}

TEST(TraceTest, ScheduleRuntimeTracesEveryAction) {
  torch::nn::Sequential model(torch::nn::Linear(4, 4), torch::nn::Tanh(), torch::nn::Linear(4, 1));
  auto tracer = std::make_shared<Tracer>();
  schedule::PipelineSchedule pipe(
      model, {2, 1},
      [](const Batch& y, const Batch& t) { return torch::mse_loss(y.tensor(), t.tensor()); },
      schedule::PipelineScheduleOptions(3).schedule(schedule::ScheduleKind::kGPipe).tracer(tracer));
  pipe.step(torch::rand({6, 4}), torch::rand({6, 1}));
  pipe.step(torch::rand({6, 4}), torch::rand({6, 1}));
  const auto plan = pipe.schedule(3);
  size_t actions = 0;
  for (const auto& list : plan.actions) actions += list.size();
  const auto events = tracer->events();
  EXPECT_EQ(events.size(), 2 * actions);
  std::map<std::string, int> by_name;
  for (const auto& e : events) {
    ++by_name[e.name];
    EXPECT_EQ(e.worker, e.stage);  // one stage per worker
    EXPECT_TRUE(e.step == 0 || e.step == 1);
  }
  EXPECT_EQ(by_name["forward"], 2 * 2 * 3);
  EXPECT_EQ(by_name["backward"], 2 * 2 * 3);
  EXPECT_EQ(by_name["send_activation"], 2 * 3);
  EXPECT_EQ(by_name["recv_gradient"], 2 * 3);
}

// GPipe records each partition's forwards, as its row, the recomputations of checkpointed
// micro-batches, which autograd runs in backward, and the backwards whose input takes a
// gradient, each recomputation inside its backward. Here all but micro-batch 0 on partition 0:
// the user's input takes none, but from micro-batch 1 on, partition 0's input carries the edge
// that orders the backwards (detail/dependency.h).
TEST(TraceTest, GPipeTracesForwardsRecomputationsAndBackwards) {
  torch::nn::Sequential sequential(torch::nn::Linear(4, 4), torch::nn::Tanh(),
                                   torch::nn::Linear(4, 1));
  auto tracer = std::make_shared<Tracer>();
  GPipe model(
      sequential,
      GPipeOptions({2, 1}).chunks(4).checkpoint(CheckpointMode::kExceptLast).tracer(tracer));
  for (int step = 0; step < 2; ++step) {
    model->forward(torch::rand({8, 4})).sum().backward();
  }
  using Key = std::tuple<std::string, int64_t, int64_t, int64_t>;  // (name, j, i, step)
  std::map<Key, int> seen;
  std::map<Key, Event> by_key;
  for (const auto& e : tracer->events()) {
    EXPECT_EQ(e.worker, e.stage);  // partition j on row j
    EXPECT_LE(e.begin_us, e.end_us);
    ++seen[{e.name, e.stage, e.microbatch, e.step}];
    by_key[{e.name, e.stage, e.microbatch, e.step}] = e;
  }
  std::map<std::tuple<std::string, int64_t, int64_t, int64_t>, int> expected;
  for (int64_t step = 0; step < 2; ++step) {
    for (int64_t j = 0; j < 2; ++j) {
      for (int64_t i = 0; i < 4; ++i) {
        expected[{"forward", j, i, step}] = 1;
        if (i < 3) expected[{"recompute", j, i, step}] = 1;  // all but the last
        if (j == 1 || i > 0) expected[{"backward", j, i, step}] = 1;
      }
    }
  }
  EXPECT_EQ(seen, expected);
  for (int64_t j = 0; j < 2; ++j) {
    for (int64_t i = 1 - j; i < 3; ++i) {
      const Event& recompute = by_key[{"recompute", j, i, 0}];
      const Event& backward = by_key[{"backward", j, i, 0}];
      EXPECT_LE(backward.begin_us, recompute.begin_us)
          << "partition " << j << ", micro-batch " << i;
      EXPECT_LE(recompute.end_us, backward.end_us) << "partition " << j << ", micro-batch " << i;
    }
  }
}

// Every span is a RecordFunction, so a profiler sees the pipeline's tasks without a tracer:
// here a global RecordFunction callback, as torch.profiler installs.
std::mutex g_profiled_mutex;
std::vector<std::string> g_profiled;  // guarded by g_profiled_mutex

std::unique_ptr<at::ObserverContext> on_function(const at::RecordFunction& function) {
  const std::string name = function.name();
  if (name.rfind("gpipe::", 0) == 0) {
    std::lock_guard<std::mutex> lock(g_profiled_mutex);
    g_profiled.push_back(name);
  }
  return nullptr;
}

TEST(TraceTest, SpansReachTheProfiler) {
  torch::nn::Sequential sequential(torch::nn::Linear(4, 4), torch::nn::Tanh(),
                                   torch::nn::Linear(4, 1));
  const auto handle = at::addGlobalCallback(at::RecordFunctionCallback(on_function));
  {
    schedule::PipelineSchedule pipe(
        sequential, {2, 1},
        [](const Batch& y, const Batch& t) { return torch::mse_loss(y.tensor(), t.tensor()); },
        schedule::PipelineScheduleOptions(2));
    pipe.step(torch::rand({4, 4}), torch::rand({4, 1}));
    GPipe model(sequential, GPipeOptions({2, 1}).chunks(2).checkpoint(CheckpointMode::kAlways));
    model->forward(torch::rand({4, 4})).sum().backward();
  }
  at::removeCallback(handle);
  std::map<std::string, int> count;
  {
    std::lock_guard<std::mutex> lock(g_profiled_mutex);
    for (const auto& name : g_profiled) ++count[name];
  }
  // Schedule: a forward and a backward per stage and micro-batch; GPipe: a forward and a
  // recomputation per partition and micro-batch.
  for (int64_t s = 0; s < 2; ++s) {
    for (int64_t i = 0; i < 2; ++i) {
      const std::string where =
          "(stage=" + std::to_string(s) + ", microbatch=" + std::to_string(i) + ")";
      EXPECT_EQ(count["gpipe::forward" + where], 2) << where;
      EXPECT_EQ(count["gpipe::backward" + where], 1) << where;
      EXPECT_EQ(count["gpipe::recompute" + where], 1) << where;
    }
  }
  EXPECT_EQ(count["gpipe::send_activation(stage=0, microbatch=1)"], 1);
}

}  // namespace
}  // namespace trace_test
}  // namespace trace
}  // namespace gpipe
