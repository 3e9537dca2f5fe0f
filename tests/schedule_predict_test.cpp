// Tests of predict() (predict.h): with unit costs it reproduces the papers' step times and
// bubbles, messages delay as costed, what each stage holds is what a real step holds, and costs
// read from a trace are its medians.
#include "test_util.h"

#include "gpipe/balance/balance.h"
#include "gpipe/schedule/generators.h"
#include "gpipe/schedule/predict.h"
#include "gpipe/schedule/runtime.h"

#include <string>
#include <thread>
#include <vector>

namespace gpipe {
namespace schedule {
namespace schedule_predict_test {
namespace {

// GPipe and 1F1B with a forward 1 and a backward 2: (M + P - 1)(1 + 2), a bubble of
// (P - 1) / (M + P - 1).
TEST(SchedulePredictTest, GPipeAndOneFOneBTakeWhatThePapersSay) {
  for (const auto kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
    for (int64_t P = 1; P <= 4; ++P) {
      for (int64_t M = 1; M <= 8; ++M) {
        SCOPED_TRACE(c10::str(kind, ", ", P, " stages, ", M, " micro-batches"));
        const Prediction p = predict(make_schedule(kind, P, P, M), ActionCosts::unit(P));
        EXPECT_DOUBLE_EQ(p.step_time, 3.0 * static_cast<double>(M + P - 1));
        EXPECT_NEAR(p.bubble_fraction, static_cast<double>(P - 1) / static_cast<double>(M + P - 1),
                    1e-12);
      }
    }
  }
}

// The zero-bubble schedules with F, B and W one each: ZB1P's bubble is the ZB-H1 paper's
// (P - 1)(F + B - W) = P - 1 (a third of 1F1B's under the same costs) and ZBV's the first
// micro-batch's way to the last worker, once M >= P; interleaved 1F1B's (v stages per worker,
// F 1 and B 2 each) is Megatron-LM's 3(P - 1) once M is a multiple of P, looped BFS's too, and
// interleaved ZB1P's then ZBV's.
TEST(SchedulePredictTest, ZeroBubbleAndInterleavedTakeWhatThePapersSay) {
  for (int64_t P = 1; P <= 4; ++P) {
    for (int64_t M = P; M <= 12; ++M) {
      SCOPED_TRACE(c10::str(P, " workers, ", M, " micro-batches"));
      const Prediction zb1p = predict(zb1p_schedule(P, M), ActionCosts::unit(P));
      EXPECT_DOUBLE_EQ(zb1p.step_time, static_cast<double>(3 * M + P - 1));
      EXPECT_NEAR(zb1p.bubble_fraction, (P - 1.0) / static_cast<double>(3 * M + P - 1), 1e-12);
      const Prediction one_f_one_b = predict(one_f_one_b_schedule(P, M), ActionCosts::unit(P));
      EXPECT_DOUBLE_EQ(one_f_one_b.step_time - 3.0 * M, 3 * (zb1p.step_time - 3.0 * M));
      EXPECT_DOUBLE_EQ(predict(zbv_schedule(P, M), ActionCosts::unit(2 * P)).step_time,
                       static_cast<double>(6 * M + P - 1));
      if (M % P == 0) {
        const double interleaved = 3.0 * static_cast<double>(2 * M + P - 1);
        EXPECT_DOUBLE_EQ(
            predict(interleaved_one_f_one_b_schedule(P, 2, M), ActionCosts::unit(2 * P)).step_time,
            interleaved);
        // Looped BFS's bubble is the same; interleaved ZB1P's is ZBV's.
        EXPECT_DOUBLE_EQ(predict(looped_bfs_schedule(P, 2, M), ActionCosts::unit(2 * P)).step_time,
                         interleaved);
        EXPECT_DOUBLE_EQ(
            predict(interleaved_zb1p_schedule(P, 2, M), ActionCosts::unit(2 * P)).step_time,
            static_cast<double>(6 * M + P - 1));
      }
    }
  }
}

// In the steady state of ZBV and interleaved ZB1P each message has an action's time to arrive,
// so a link's latency costs the warm-up and the cool-down, not every micro-batch: the step grows
// as much at 4W micro-batches as at 2W. (The orders simulated with free messages alone left
// messages on the critical path all along: with 4 workers a latency of 0.1 added 3.4 actions at
// 8 micro-batches, 6.6 at 16.)
TEST(SchedulePredictTest, ZeroBubbleOrdersHideTheLinkInTheirSteadyState) {
  for (const int64_t W : {2, 3, 4, 8}) {
    for (const bool v_shape : {true, false}) {
      SCOPED_TRACE(c10::str(W, " workers, ", v_shape ? "zbv" : "interleaved_zb1p"));
      const auto added_by_latency = [&](int64_t M) {
        const Schedule schedule = v_shape ? zbv_schedule(W, M) : interleaved_zb1p_schedule(W, 2, M);
        ActionCosts costs = ActionCosts::unit(2 * W);
        const double free_messages = predict(schedule, costs).step_time;
        EXPECT_DOUBLE_EQ(free_messages, static_cast<double>(6 * M + W - 1));
        costs.latency = 0.1;
        return predict(schedule, costs).step_time - free_messages;
      };
      EXPECT_NEAR(added_by_latency(4 * W), added_by_latency(2 * W), 1e-9);
    }
  }
}

// A message between workers takes its latency plus its bytes; one between two stages of one
// worker, nothing.
TEST(SchedulePredictTest, MessagesTakeWhatTheyCost) {
  ActionCosts costs = ActionCosts::unit(2);
  costs.latency = 0.5;
  costs.seconds_per_byte = 0.25;
  costs.message_bytes = {4, 0};
  // F0, activation (0.5 + 1), F1, B1, gradient (0.5 + 1), B0.
  const Prediction p = predict(one_f_one_b_schedule(2, 1), costs);
  EXPECT_DOUBLE_EQ(p.step_time, 1 + 1.5 + 1 + 2 + 1.5 + 2);
  EXPECT_DOUBLE_EQ(p.busy[0], 3);
  EXPECT_DOUBLE_EQ(p.bubble_fraction, 1 - 6 / (2 * 9.0));
  // Worker 0 waits from the end of its forward (1) for the gradient (5.5 + 1.5).
  EXPECT_DOUBLE_EQ(p.end[0][1], 1);  // SendActivation
  EXPECT_DOUBLE_EQ(p.begin[0][2], 1);
  EXPECT_DOUBLE_EQ(p.end[0][2], 7);  // RecvGradient
  EXPECT_DOUBLE_EQ(predict(zbv_schedule(1, 3), costs).step_time, 18);
  costs.forward = {1};
  GPIPE_EXPECT_THROW_WITH(predict(one_f_one_b_schedule(2, 1), costs), c10::ValueError,
                          "costs: forward has 1 entries for 2 stages");
}

// With a receive window of w, an edge's message k leaves only once the receive of message k - w
// has ended and the sender has heard of it: a window of 1 lets one message per round trip
// through, a window of 2 two, no window every one as soon as it is sent.
TEST(SchedulePredictTest, ReceiveWindowLetsThatManyMessagesFly) {
  ActionCosts costs = ActionCosts::unit(2);
  costs.latency = 10;
  const Schedule plan = gpipe_schedule(2, 4);
  // When stage 1 starts each forward, in order.
  const auto forwards = [&](int64_t window) {
    costs.receive_window = window;
    const Prediction p = predict(plan, costs);
    std::vector<double> begins;
    for (size_t k = 0; k < plan.actions[1].size(); ++k) {
      if (plan.actions[1][k].kind == ActionKind::kForward) begins.push_back(p.begin[1][k]);
    }
    return begins;
  };
  // Stage 0 sends at 1, 2, 3 and 4; each message takes 10.
  EXPECT_EQ(forwards(0), (std::vector<double>{11, 12, 13, 14}));
  // Message k + 1 leaves 10 after message k was received, and arrives 10 later.
  EXPECT_EQ(forwards(1), (std::vector<double>{11, 31, 51, 71}));
  EXPECT_EQ(forwards(2), (std::vector<double>{11, 12, 31, 32}));
  costs.receive_window = -1;
  GPIPE_EXPECT_THROW_WITH(predict(plan, costs), c10::ValueError,
                          "costs: receive_window must be non-negative, but is -1");
}

// Workers that outnumber the cores share them: two computing on one core each take twice as
// long, and one left alone goes back to full speed with what it has left.
TEST(SchedulePredictTest, WorkersShareTheCoresTheyOutnumber) {
  ActionCosts costs = ActionCosts::unit(2);
  costs.forward = {1, 2};
  const Schedule plan = gpipe_schedule(2, 2);
  // When each worker's forwards end, in order.
  const auto forwards_end = [&](int64_t cores, int64_t worker) {
    costs.cores = cores;
    const Prediction p = predict(plan, costs);
    std::vector<double> ends;
    for (size_t k = 0; k < plan.actions[worker].size(); ++k) {
      if (plan.actions[worker][k].kind == ActionKind::kForward) ends.push_back(p.end[worker][k]);
    }
    return ends;
  };
  // Alone: worker 0 forwards at 0-1 and 1-2, worker 1 at 1-3 and 3-5.
  EXPECT_EQ(forwards_end(0, 0), (std::vector<double>{1, 2}));
  EXPECT_EQ(forwards_end(0, 1), (std::vector<double>{3, 5}));
  // On one core, from 1 both compute at half speed: worker 0's second forward (1) ends at 3,
  // when worker 1's first (2) is half done; alone again, it ends at 4, the next at 6.
  EXPECT_EQ(forwards_end(1, 0), (std::vector<double>{1, 3}));
  EXPECT_EQ(forwards_end(1, 1), (std::vector<double>{4, 6}));

  // A core per worker or more is what no sharing is, time for time.
  for (const auto& [W, M] : {std::pair<int64_t, int64_t>{4, 8}, {3, 5}}) {
    const Schedule schedule = one_f_one_b_schedule(W, M);
    ActionCosts c = ActionCosts::unit(W);
    const Prediction own = predict(schedule, c);
    c.cores = W;
    EXPECT_EQ(predict(schedule, c).end, own.end);
    // On one core the work is done one action at a time, and one is always ready.
    c.cores = 1;
    const Prediction one = predict(schedule, c);
    EXPECT_DOUBLE_EQ(one.step_time, 3.0 * static_cast<double>(W * M));
    EXPECT_EQ(one.busy, own.busy);
    EXPECT_DOUBLE_EQ(one.bubble_fraction, 0);  // of the one core's time
    // On two, at least half the work and at least the unshared step.
    c.cores = 2;
    const double two = predict(schedule, c).step_time;
    EXPECT_GE(two, 1.5 * static_cast<double>(W * M));
    EXPECT_GE(two, own.step_time);
    EXPECT_LT(two, one.step_time);
  }
  // This machine: its cores, each worker of one intra-op thread on one; at least one worker.
  const auto machine = static_cast<int64_t>(std::thread::hardware_concurrency());
  EXPECT_EQ(cpu_workers_at_once(1), std::max<int64_t>(1, machine));
  EXPECT_EQ(cpu_workers_at_once(2 * machine + 2), 1);
  costs.cores = -1;
  GPIPE_EXPECT_THROW_WITH(predict(plan, costs), c10::ValueError,
                          "costs: cores must be non-negative, but is -1");
}

// A schedule simulated once predicts as it does simulated each time; a timeline of another
// schedule is refused.
TEST(SchedulePredictTest, ATimelineMadeOnceServesManyCosts) {
  const Schedule plan = one_f_one_b_schedule(3, 6);
  const Timeline timeline = simulate(plan);
  ActionCosts costs = ActionCosts::unit(3);
  for (const double forward : {0.5, 1.0, 3.0}) {
    costs.forward.assign(3, forward);
    const Prediction each = predict(plan, costs);
    const Prediction once = predict(plan, costs, timeline);
    EXPECT_EQ(once.end, each.end);
    EXPECT_EQ(once.peak_live_microbatches, each.peak_live_microbatches);
  }
  GPIPE_EXPECT_THROW_WITH(predict(one_f_one_b_schedule(3, 5), costs, timeline), c10::ValueError,
                          "the timeline is not the schedule's");
}

// What a stage holds at most is what a real step's Stage held, for every schedule.
TEST(SchedulePredictTest, PeakLiveMicroBatchesAreTheRealOnes) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int k = 0; k < 8; ++k) model->push_back(torch::nn::Linear(3, 3));
  const at::Tensor input = torch::randn({24, 3});  // M micro-batches of 24 / M rows
  const at::Tensor target = torch::randn({24, 3});
  const LossFunction mse = [](const Batch& output, const Batch& target) {
    return torch::mse_loss(output.tensor(), target.tensor());
  };
  for (const auto& name : schedule_names()) {
    const ScheduleKind kind = parse_schedule_kind(name);
    const int64_t per_worker = loops_stages(kind) || placement_of(kind) == Placement::kV ? 2 : 1;
    for (int64_t workers = 1; workers <= 4; ++workers) {
      for (const int64_t M : {1, 3, 6, 8}) {
        if (M < min_microbatches(kind, workers * per_worker)) continue;
        SCOPED_TRACE(c10::str(name, ", ", workers, " workers, ", M, " micro-batches"));
        const int64_t S = workers * per_worker;
        PipelineSchedule pipe(
            model, balance::balance_by_count(S, 8), mse,
            PipelineScheduleOptions(M).schedule(kind).stages_per_worker(per_worker));
        pipe.step(input, target);
        const Prediction p = predict(pipe.schedule(M), ActionCosts::unit(S));
        for (int64_t s = 0; s < S; ++s) {
          EXPECT_EQ(p.peak_live_microbatches[s], pipe.peak_live_microbatches(s)) << "stage " << s;
        }
      }
    }
  }
}

TEST(SchedulePredictTest, CostsFromATraceAreMedians) {
  std::vector<trace::Event> events;
  const auto add = [&](const std::string& name, int64_t stage, double us) {
    events.push_back({name, /*worker=*/stage, stage, /*microbatch=*/0, /*step=*/0, 10, 10 + us});
  };
  for (const double us : {100, 300, 200}) add("forward", 0, us);
  add("backward", 0, 400);
  add("forward", 1, 50);
  add("backward_input", 1, 30);
  add("backward_weight", 1, 70);
  add("send_activation", 0, 999);  // not a cost
  const ActionCosts costs = costs_from_trace(events, 2);
  EXPECT_DOUBLE_EQ(costs.forward[0], 200e-6);
  EXPECT_DOUBLE_EQ(costs.backward[0], 400e-6);
  EXPECT_DOUBLE_EQ(costs.backward_input[0], 200e-6);  // half a backward
  EXPECT_DOUBLE_EQ(costs.backward_weight[0], 200e-6);
  EXPECT_DOUBLE_EQ(costs.forward[1], 50e-6);
  EXPECT_DOUBLE_EQ(costs.backward[1], 100e-6);  // its halves
  GPIPE_EXPECT_THROW_WITH(costs_from_trace(events, 3), c10::ValueError,
                          "the trace has no forward of stage 2");
}

// Read on shared cores, each event counts what it would have taken alone.
TEST(SchedulePredictTest, CostsFromATraceOnSharedCoresAreTheirTimesAlone) {
  std::vector<trace::Event> events;
  const auto add = [&](const std::string& name, int64_t stage, double begin, double end) {
    events.push_back({name, /*worker=*/stage, stage, /*microbatch=*/0, /*step=*/0, begin, end});
  };
  // Two forwards overlap from 100 to 200 us; the backwards run alone.
  add("forward", 0, 0, 200);
  add("forward", 1, 100, 300);
  add("send_activation", 0, 150, 160);  // not computing
  add("backward", 1, 300, 340);
  add("backward", 0, 400, 480);
  const ActionCosts one = costs_from_trace(events, 2, /*cores=*/1);
  EXPECT_EQ(one.cores, 1);
  EXPECT_DOUBLE_EQ(one.forward[0], 150e-6);  // 100 alone, then 100 at half speed
  EXPECT_DOUBLE_EQ(one.forward[1], 150e-6);
  EXPECT_DOUBLE_EQ(one.backward[1], 40e-6);
  EXPECT_DOUBLE_EQ(one.backward[0], 80e-6);
  const ActionCosts two = costs_from_trace(events, 2, /*cores=*/2);
  EXPECT_DOUBLE_EQ(two.forward[0], 200e-6);
  EXPECT_DOUBLE_EQ(two.forward[1], 200e-6);
  EXPECT_EQ(costs_from_trace(events, 2).cores, 0);
  GPIPE_EXPECT_THROW_WITH(costs_from_trace(events, 2, -1), c10::ValueError,
                          "cores must be non-negative, but got -1");
}

}  // namespace
}  // namespace schedule_predict_test
}  // namespace schedule
}  // namespace gpipe
