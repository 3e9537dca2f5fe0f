// Tests of the schedule generators and of validate(): generated schedules are valid, hand-made
// broken ones are rejected naming the offending action.
#include "test_util.h"

#include "held_microbatches.h"

#include "gpipe/schedule/action.h"
#include "gpipe/schedule/generators.h"
#include "gpipe/schedule/validate.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

namespace gpipe {
namespace schedule {
namespace schedule_validate_test {
namespace {

using K = ActionKind;

using testing::most_held;

TEST(ScheduleValidateTest, GeneratedSchedulesAreValid) {
  for (int64_t stages = 1; stages <= 4; ++stages) {
    for (int64_t m = 1; m <= 8; ++m) {
      for (int64_t capacity : {int64_t{0}, m, int64_t{1}}) {
        const auto options = ValidateOptions().queue_capacity(capacity);
        EXPECT_NO_THROW(validate(gpipe_schedule(stages, m), options)) << stages << " " << m;
        EXPECT_NO_THROW(validate(one_f_one_b_schedule(stages, m), options)) << stages << " " << m;
        EXPECT_NO_THROW(validate(zb1p_schedule(stages, m), options)) << stages << " " << m;
        // Interleaved 1F1B sends ahead more than one message per edge: it needs room for them.
        if (capacity == 1) continue;
        for (int64_t v = 1; v <= 3; ++v) {
          EXPECT_NO_THROW(validate(interleaved_one_f_one_b_schedule(stages, v, m), options))
              << stages << " workers, " << v << " stages each, " << m << " micro-batches";
          EXPECT_NO_THROW(validate(interleaved_zb1p_schedule(stages, v, m), options))
              << stages << " workers, " << v << " stages each, " << m << " micro-batches";
          EXPECT_NO_THROW(validate(looped_bfs_schedule(stages, v, m), options))
              << stages << " workers, " << v << " stages each, " << m << " micro-batches";
        }
      }
    }
  }
}

// Every stage forwards and backwards every micro-batch once; 1F1B keeps at most S - s pending on
// stage s, GPipe all M.
TEST(ScheduleValidateTest, PendingMicroBatchesPerStage) {
  for (int64_t stages = 1; stages <= 4; ++stages) {
    for (int64_t m = 1; m <= 8; ++m) {
      for (const bool one_f_one_b : {false, true}) {
        const Schedule schedule =
            one_f_one_b ? one_f_one_b_schedule(stages, m) : gpipe_schedule(stages, m);
        for (int64_t s = 0; s < stages; ++s) {
          int64_t pending = 0, most = 0, forwards = 0, backwards = 0;
          for (const Action& a : schedule.actions[s]) {
            EXPECT_EQ(a.stage, s);
            if (a.kind == K::kForward) most = std::max(most, ++pending), ++forwards;
            if (a.kind == K::kBackward) --pending, ++backwards;
          }
          EXPECT_EQ(forwards, m);
          EXPECT_EQ(backwards, m);
          EXPECT_EQ(most, one_f_one_b ? std::min(stages - s, m) : m) << stages << " " << m;
        }
      }
    }
  }
}

// ZB1P splits every backward; stage s defers s weight passes on top of 1F1B's S - s pending
// forwards, so every stage holds at most min(S, M) micro-batches, stage 0 as many as in 1F1B.
TEST(ScheduleValidateTest, ZeroBubblePendingMicroBatchesPerStage) {
  for (int64_t stages = 1; stages <= 4; ++stages) {
    for (int64_t m = 1; m <= 8; ++m) {
      const Schedule schedule = zb1p_schedule(stages, m);
      const Timeline timeline = simulate(schedule);
      const Timeline one_f_one_b = simulate(one_f_one_b_schedule(stages, m));
      ASSERT_EQ(timeline.peak_live_microbatches.size(), static_cast<size_t>(stages));
      EXPECT_EQ(timeline.peak_live_microbatches[0], one_f_one_b.peak_live_microbatches[0])
          << stages << " " << m;
      for (int64_t s = 0; s < stages; ++s) {
        EXPECT_EQ(one_f_one_b.peak_live_microbatches[s], std::min(stages - s, m));
        EXPECT_LE(timeline.peak_live_microbatches[s], std::min(stages, m)) << stages << " " << m;
        int64_t forwards = 0, inputs = 0, weights = 0;
        for (const Action& a : schedule.actions[s]) {
          EXPECT_NE(a.kind, K::kBackward) << a;
          forwards += a.kind == K::kForward;
          inputs += a.kind == K::kBackwardInput;
          weights += a.kind == K::kBackwardWeight;
        }
        EXPECT_EQ(forwards, m);
        EXPECT_EQ(inputs, m);
        EXPECT_EQ(weights, m);
      }
      // Each stage runs M more compute rounds than 1F1B (its W's), and the W's fill bubbles
      // instead of adding any.
      EXPECT_LE(timeline.num_rounds, one_f_one_b.num_rounds + m) << stages << " " << m;
    }
  }
}

// The moments a worker's memory can peak: GPipe's worker 0 as each of its 3 forwards starts and
// after it, and as each of its 3 backwards starts.
TEST(ScheduleValidateTest, HeldMicrobatchesAtEveryMomentMemoryCanPeak) {
  const Timeline gpipe = simulate(gpipe_schedule(2, 3));
  std::vector<HeldMicrobatches> worker0;
  for (const auto& moment : gpipe.held_microbatches[0]) {
    ASSERT_EQ(moment.size(), 1u);  // one stage
    worker0.push_back(moment[0]);
  }
  using Starting = HeldMicrobatches::Starting;
  // The seventh count: outputs sent that no message back has said came. Stage 1's first
  // gradient, sent after all 3 activations came, says so for all of them. The last two: forwards
  // and backwards not started yet, the one starting excluded.
  std::vector<HeldMicrobatches> expected{
      {0, 0, Starting::kForward, 0, 0, 0, 0, 2, 3},  {1, 0, Starting::kForward, 0, 0, 0, 1, 1, 3},
      {2, 0, Starting::kForward, 0, 0, 0, 2, 0, 3},  {1, 0, Starting::kNothing, 0, 0, 0, 1, 2, 3},
      {2, 0, Starting::kNothing, 0, 0, 0, 2, 1, 3},  {3, 0, Starting::kNothing, 0, 0, 0, 3, 0, 3},
      {3, 0, Starting::kBackward, 0, 0, 0, 0, 0, 2}, {2, 0, Starting::kBackward, 0, 0, 0, 0, 0, 1},
      {1, 0, Starting::kBackward, 0, 0, 0, 0, 0, 0}};
  std::sort(worker0.begin(), worker0.end());
  std::sort(expected.begin(), expected.end());
  ASSERT_EQ(worker0.size(), expected.size());
  for (size_t k = 0; k < expected.size(); ++k) {
    EXPECT_FALSE(worker0[k] < expected[k] || expected[k] < worker0[k]) << k;
  }
  // The last stage's gradients sent upstream so far, as each of its backwards starts.
  std::vector<int64_t> sent;
  for (const auto& moment : gpipe.held_microbatches[1]) {
    if (moment[0].starting == Starting::kBackward) sent.push_back(moment[0].sent_upstream);
    EXPECT_EQ(moment[0].unreturned, 0);  // no next stage
  }
  std::sort(sent.begin(), sent.end());
  EXPECT_EQ(sent, (std::vector<int64_t>{0, 1, 2}));
  // Under 1F1B each activation that comes after stage 0 took a gradient says so: the last stage
  // holds one gradient sent as each backward starts, not all of them.
  sent.clear();
  const Timeline one_f_one_b = simulate(one_f_one_b_schedule(2, 6));
  for (const auto& moment : one_f_one_b.held_microbatches[1]) {
    if (moment[0].starting == Starting::kBackward) sent.push_back(moment[0].sent_upstream);
  }
  std::sort(sent.begin(), sent.end());
  EXPECT_EQ(sent, (std::vector<int64_t>{0, 1, 1, 1, 1, 1}));
  // Under a split backward, and with stages sharing a worker, the counts of each stage are
  // among them, up to the peaks; at most one stage starts an action at a moment.
  for (const Schedule& schedule : {zb1p_schedule(3, 6), zbv_schedule(2, 4), v_min_schedule(2, 6),
                                   interleaved_one_f_one_b_schedule(2, 2, 4)}) {
    const Timeline timeline = simulate(schedule);
    std::vector<int64_t> live(schedule.num_stages, 0), awaiting(schedule.num_stages, 0);
    for (int64_t w = 0; w < schedule.num_workers; ++w) {
      std::vector<int64_t> stages;
      for (int64_t s = 0; s < schedule.num_stages; ++s) {
        if (schedule.worker_of(s) == w) stages.push_back(s);
      }
      for (const auto& moment : timeline.held_microbatches[w]) {
        ASSERT_EQ(moment.size(), stages.size()) << "worker " << w;
        int64_t starting = 0;
        for (size_t j = 0; j < stages.size(); ++j) {
          live[stages[j]] = std::max(live[stages[j]], moment[j].live);
          awaiting[stages[j]] = std::max(awaiting[stages[j]], moment[j].awaiting);
          starting += moment[j].starting != HeldMicrobatches::Starting::kNothing ? 1 : 0;
          // Gradients on their way upstream, outputs the next stage holds past this stage's
          // weight gradient: only where the stage before or after can lag, and the latter
          // only where backwards are split.
          EXPECT_GE(moment[j].upstream, 0);
          EXPECT_LE(moment[j].upstream, stages[j] == 0 ? 0 : schedule.num_microbatches);
          EXPECT_GE(moment[j].downstream, 0);
          EXPECT_LE(moment[j].downstream,
                    splits_backward(schedule) ? schedule.num_microbatches : 0);
          // What crosses between ranks: gradients sent by all but the first stage, outputs
          // sent by all but the last.
          EXPECT_GE(moment[j].sent_upstream, 0);
          EXPECT_LE(moment[j].sent_upstream, stages[j] == 0 ? 0 : schedule.num_microbatches);
          EXPECT_GE(moment[j].unreturned, 0);
          EXPECT_LE(moment[j].unreturned,
                    stages[j] + 1 == schedule.num_stages ? 0 : schedule.num_microbatches);
          // Every micro-batch forwarded and not yet backwarded here is live.
          EXPECT_GE(moment[j].forwards_left, 0);
          EXPECT_LE(moment[j].forwards_left, moment[j].backwards_left);
          EXPECT_LE(moment[j].backwards_left - moment[j].forwards_left, moment[j].live + 1);
        }
        EXPECT_LE(starting, 1) << "worker " << w;
      }
    }
    EXPECT_EQ(live, timeline.peak_live_microbatches);
    EXPECT_EQ(awaiting, timeline.peak_awaiting_weight_microbatches);
  }
}

// ZBV: worker w runs stages w and 2W - 1 - w, every stage each micro-batch's forward, input and
// weight gradient once; a worker holds at most 2W micro-batches of its half-size stages (1F1B's
// first stage holds W full ones).
TEST(ScheduleValidateTest, ZbvRunsAVAndHoldsWhat1F1BHolds) {
  for (int64_t W = 1; W <= 4; ++W) {
    for (int64_t m = 1; m <= 16; ++m) {
      SCOPED_TRACE(::testing::Message() << W << " workers, " << m << " micro-batches");
      const Schedule schedule = zbv_schedule(W, m);
      EXPECT_EQ(schedule.placement, Placement::kV);
      EXPECT_EQ(schedule.num_stages, 2 * W);
      for (const int64_t capacity : {int64_t{0}, m}) {
        EXPECT_NO_THROW(validate(schedule, ValidateOptions().queue_capacity(capacity)));
      }
      for (int64_t w = 0; w < W; ++w) {
        std::map<std::pair<int64_t, K>, int64_t> counts;  // per (stage, kind)
        for (const Action& a : schedule.actions[w]) {
          EXPECT_TRUE(a.stage == w || a.stage == 2 * W - 1 - w) << "worker " << w << ": " << a;
          EXPECT_NE(a.kind, K::kBackward) << a;
          ++counts[{a.stage, a.kind}];
        }
        EXPECT_LE(most_held(schedule.actions[w]), 2 * W) << "worker " << w;
        for (const int64_t s : {w, 2 * W - 1 - w}) {
          for (const K kind : {K::kForward, K::kBackwardInput, K::kBackwardWeight}) {
            EXPECT_EQ((counts[{s, kind}]), m) << "stage " << s << ", " << kind;
          }
        }
      }
    }
  }
}

TEST(ScheduleValidateTest, WithCommunicationTakesComputeActionsOnly) {
  GPIPE_EXPECT_THROW_WITH(with_communication(one_f_one_b_schedule(2, 1)), c10::ValueError,
                          "with_communication takes compute actions only, but worker 0 has "
                          "SendActivation(microbatch=0, stage=0)");
}

// Hand-broken ZBV schedules are refused naming the action: a forward of the V's turn before its
// input comes round, and a stage of the other worker.
TEST(ScheduleValidateTest, RejectsBrokenVSchedules) {
  Schedule early = zbv_schedule(2, 2);
  auto& turn = early.actions[1];  // worker 1 runs stages 1 and 2: the turn
  const auto forward = std::find(turn.begin(), turn.end(), Action{K::kForward, 0, 2});
  ASSERT_NE(forward, turn.end());
  std::rotate(turn.begin(), forward, forward + 1);  // Forward(0, 2) first
  GPIPE_EXPECT_THROW_WITH(validate(early), c10::ValueError,
                          "worker 1, action 0, Forward(microbatch=0, stage=2): uses the activation "
                          "of micro-batch 0 before it arrives");
  Schedule misplaced = zbv_schedule(2, 2);
  misplaced.actions[0].insert(misplaced.actions[0].begin(), Action{K::kForward, 0, 1});
  GPIPE_EXPECT_THROW_WITH(validate(misplaced), c10::ValueError,
                          "worker 0, action 0, Forward(microbatch=0, stage=1): stage 1 runs on "
                          "worker 1, not on worker 0");
}

// DualPipeV: ZBV's stages; every stage runs each micro-batch's forward once and its backward
// once, whole or as an input half with the weight half later; from 2W micro-batches on.
TEST(ScheduleValidateTest, DualPipeVRunsAVWithEveryActionOnce) {
  for (int64_t W = 1; W <= 4; ++W) {
    for (int64_t m = 2 * W; m <= 16; ++m) {
      SCOPED_TRACE(::testing::Message() << W << " workers, " << m << " micro-batches");
      const Schedule schedule = dualpipev_schedule(W, m);
      EXPECT_EQ(schedule.placement, Placement::kV);
      EXPECT_EQ(schedule.num_stages, 2 * W);
      EXPECT_TRUE(splits_backward(schedule));
      for (const int64_t capacity : {int64_t{0}, m}) {
        EXPECT_NO_THROW(validate(schedule, ValidateOptions().queue_capacity(capacity)));
      }
      for (int64_t w = 0; w < W; ++w) {
        std::map<std::pair<int64_t, K>, int64_t> counts;  // per (stage, kind)
        for (const Action& a : schedule.actions[w]) {
          EXPECT_TRUE(a.stage == w || a.stage == 2 * W - 1 - w) << "worker " << w << ": " << a;
          ++counts[{a.stage, a.kind}];
        }
        for (const int64_t s : {w, 2 * W - 1 - w}) {
          EXPECT_EQ((counts[{s, K::kForward}]), m) << "stage " << s;
          EXPECT_EQ((counts[{s, K::kBackward}] + counts[{s, K::kBackwardInput}]), m)
              << "stage " << s;
          EXPECT_EQ((counts[{s, K::kBackwardWeight}]), (counts[{s, K::kBackwardInput}]))
              << "stage " << s;
        }
      }
    }
  }
  GPIPE_EXPECT_THROW_WITH(dualpipev_schedule(2, 3), c10::ValueError,
                          "schedule dualpipev needs at least as many micro-batches as stages (4 "
                          "for 2 workers), but got 3");
  EXPECT_EQ(min_microbatches(ScheduleKind::kDualPipeV, 6), 6);
  EXPECT_EQ(min_microbatches(ScheduleKind::kZeroBubbleV, 6), 1);
}

// Hand-broken DualPipeV schedules are refused naming the action: a weight gradient left out, and
// the loss stage's first input gradient moved before its forward.
TEST(ScheduleValidateTest, RejectsBrokenDualPipeVSchedules) {
  Schedule missing = dualpipev_schedule(2, 4);
  auto& list = missing.actions[1];
  const auto weight = std::find_if(list.begin(), list.end(),
                                   [](const Action& a) { return a.kind == K::kBackwardWeight; });
  ASSERT_NE(weight, list.end());
  const Action dropped = *weight;
  list.erase(weight);
  GPIPE_EXPECT_THROW_WITH(
      validate(missing), c10::ValueError,
      "invalid schedule: it never runs " + to_string(dropped) + " (a stage of worker 1)");

  Schedule early = dualpipev_schedule(2, 4);
  auto& first = early.actions[0];  // worker 0 runs stage 0 and the loss stage 3
  const auto backward = std::find(first.begin(), first.end(), Action{K::kBackwardInput, 0, 3});
  ASSERT_NE(backward, first.end());
  std::rotate(first.begin(), backward, backward + 1);
  GPIPE_EXPECT_THROW_WITH(validate(early), c10::ValueError,
                          "worker 0, action 0, BackwardInput(microbatch=0, stage=3): runs before "
                          "the forward of micro-batch 0 on stage 3");
}

// With unit costs ZBV has no bubble once there are as many micro-batches as workers: each worker
// computes its 6M actions (F, B and W of two stages) in 6M + W - 1 rounds, W - 1 being how long
// the first micro-batch takes to reach the last worker, which no schedule avoids. (1F1B on W
// stages of twice the size takes (M + W - 1)(2 + 4) = 6M + 6(W - 1) such rounds.)
TEST(ScheduleValidateTest, ZbvFillsItsBubbleWithUnitCosts) {
  for (int64_t W = 1; W <= 4; ++W) {
    for (int64_t m = W; m <= 16; ++m) {
      EXPECT_EQ(simulate(zbv_schedule(W, m)).num_rounds, 6 * m + W - 1)
          << W << " workers, " << m << " micro-batches";
    }
  }
}

// Looped BFS holds every micro-batch on every stage, as GPipe does; interleaved ZB1P at most
// interleaved 1F1B's warm-up bound plus W more on a worker.
TEST(ScheduleValidateTest, LoopedBfsAndInterleavedZb1pHold) {
  for (int64_t W = 1; W <= 4; ++W) {
    for (int64_t v = 1; v <= 3; ++v) {
      for (int64_t m = 1; m <= 8; ++m) {
        SCOPED_TRACE(c10::str(W, " workers, ", v, " stages each, ", m, " micro-batches"));
        const Timeline bfs = simulate(looped_bfs_schedule(W, v, m));
        for (const int64_t peak : bfs.peak_live_microbatches) EXPECT_EQ(peak, m);
        const Schedule zb = interleaved_zb1p_schedule(W, v, m);
        for (int64_t w = 0; w < W; ++w) {
          for (const Action& a : zb.actions[w]) EXPECT_EQ(a.stage % W, w) << a;
          EXPECT_LE(most_held(zb.actions[w]), (W - w - 1) * 2 + (v - 1) * W + 1 + W)
              << "worker " << w;
        }
      }
    }
  }
}

TEST(ScheduleValidateTest, InterleavedRunsEveryStageOnItsWorker) {
  const Schedule schedule = interleaved_one_f_one_b_schedule(2, 2, 4);
  EXPECT_EQ(schedule.num_workers, 2);
  EXPECT_EQ(schedule.num_stages, 4);
  for (int64_t w = 0; w < 2; ++w) {
    for (const Action& a : schedule.actions[w]) EXPECT_EQ(a.stage % 2, w) << a;
  }
  // Worker 0 begins Megatron-style: forwards of chunk 0 for the round, then of chunk 1.
  std::vector<Action> forwards;
  for (const Action& a : schedule.actions[0]) {
    if (a.kind == K::kForward) forwards.push_back(a);
  }
  ASSERT_GE(forwards.size(), 4u);
  EXPECT_EQ(forwards[0], (Action{K::kForward, 0, 0}));
  EXPECT_EQ(forwards[1], (Action{K::kForward, 1, 0}));
  EXPECT_EQ(forwards[2], (Action{K::kForward, 0, 2}));
  EXPECT_EQ(forwards[3], (Action{K::kForward, 1, 2}));
}

TEST(ScheduleValidateTest, MakeScheduleChecksStages) {
  GPIPE_EXPECT_THROW_WITH(make_schedule(ScheduleKind::kOneFOneB, 2, 4, 4), c10::ValueError,
                          "one stage per worker, but got 4 stages for 2 workers");
  GPIPE_EXPECT_THROW_WITH(make_schedule(ScheduleKind::kInterleavedOneFOneB, 2, 3, 4),
                          c10::ValueError, "multiple of the number of workers, but got 3");
  GPIPE_EXPECT_THROW_WITH(gpipe_schedule(2, 0), c10::ValueError,
                          "num_microbatches must be positive, but got 0");
  EXPECT_EQ(parse_schedule_kind("1f1b"), ScheduleKind::kOneFOneB);
  EXPECT_EQ(parse_schedule_kind("zb1p"), ScheduleKind::kZeroBubble);
  EXPECT_EQ(c10::str(ScheduleKind::kZeroBubble), "zb1p");
  GPIPE_EXPECT_THROW_WITH(make_schedule(ScheduleKind::kZeroBubble, 2, 4, 4), c10::ValueError,
                          "schedule zb1p runs one stage per worker, but got 4 stages for 2");
  EXPECT_EQ(parse_schedule_kind("zbv"), ScheduleKind::kZeroBubbleV);
  GPIPE_EXPECT_THROW_WITH(make_schedule(ScheduleKind::kZeroBubbleV, 2, 2, 4), c10::ValueError,
                          "schedule zbv runs two stages per worker in a V, but got 2 stages for 2");
  EXPECT_EQ(make_schedule(ScheduleKind::kZeroBubbleV, 3, 6, 4).placement, Placement::kV);
  EXPECT_EQ(parse_schedule_kind("dualpipev"), ScheduleKind::kDualPipeV);
  GPIPE_EXPECT_THROW_WITH(make_schedule(ScheduleKind::kDualPipeV, 2, 3, 4), c10::ValueError,
                          "schedule dualpipev runs two stages per worker in a V, but got 3 stages");
  EXPECT_EQ(make_schedule(ScheduleKind::kDualPipeV, 3, 6, 6).placement, Placement::kV);
  GPIPE_EXPECT_THROW_WITH(
      parse_schedule_kind("zb"), c10::ValueError,
      "unknown schedule kind 'zb' (expected gpipe, 1f1b, interleaved_1f1b, zb1p, zbv, "
      "interleaved_zb1p, looped_bfs, dualpipev, v_min, v_half)");
  for (const auto& name : schedule_names()) EXPECT_EQ(c10::str(parse_schedule_kind(name)), name);
  EXPECT_EQ(schedule_names().size(), 10u);
}

// The one rule of every engine and the command, worded with the caller's names for the options.
TEST(ScheduleValidateTest, ScheduleOptionRules) {
  for (const auto& name : schedule_names()) {
    const ScheduleKind kind = parse_schedule_kind(name);
    const int64_t stages_per_worker = placement_of(kind) == Placement::kV ? 2 : 1;
    EXPECT_NO_THROW(check_schedule_options(kind, stages_per_worker, CheckpointMode::kNever))
        << name;
    GPIPE_EXPECT_THROW_WITH(check_schedule_options(kind, 0, CheckpointMode::kNever),
                            c10::ValueError, "stages_per_worker must be positive, but got 0");
  }
  EXPECT_NO_THROW(
      check_schedule_options(ScheduleKind::kInterleavedOneFOneB, 3, CheckpointMode::kAlways));
  GPIPE_EXPECT_THROW_WITH(
      check_schedule_options(ScheduleKind::kGPipe, 2, CheckpointMode::kNever), c10::ValueError,
      "schedule gpipe runs one stage per worker, but stages_per_worker is 2 (more than 1 only "
      "with interleaved_1f1b, interleaved_zb1p and looped_bfs; 2 with zbv, dualpipev, v_min and "
      "v_half)");
  GPIPE_EXPECT_THROW_WITH(
      check_schedule_options(ScheduleKind::kZeroBubbleV, 1, CheckpointMode::kNever),
      c10::ValueError,
      "schedule zbv runs two stages per worker in a V, but stages_per_worker is 1 (set it to 2)");
  GPIPE_EXPECT_THROW_WITH(
      check_schedule_options(ScheduleKind::kZeroBubbleV, 2, CheckpointMode::kAlways),
      c10::ValueError, "schedule zbv splits each backward into input and weight gradients");
  GPIPE_EXPECT_THROW_WITH(
      check_schedule_options(ScheduleKind::kDualPipeV, 2, CheckpointMode::kAlways), c10::ValueError,
      "schedule dualpipev splits each backward into input and weight gradients");
  GPIPE_EXPECT_THROW_WITH(
      check_schedule_options(ScheduleKind::kZeroBubble, 1, CheckpointMode::kExceptLast),
      c10::ValueError,
      "schedule zb1p splits each backward into input and weight gradients, which checkpoint "
      "cannot: use checkpoint with gpipe, 1f1b, interleaved_1f1b or looped_bfs");
  ScheduleOptionNames flags;
  flags.schedule = "--schedule";
  flags.stages_per_worker = "--virtual-stages";
  flags.checkpoint = "--checkpoint";
  GPIPE_EXPECT_THROW_WITH(
      check_schedule_options(ScheduleKind::kOneFOneB, 2, CheckpointMode::kNever, flags),
      c10::ValueError, "--schedule 1f1b runs one stage per worker, but --virtual-stages is 2");
}

// Counts no memory could hold are refused with their exact size, before any allocation.
TEST(ScheduleValidateTest, MakeScheduleRefusesHugeCounts) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const auto kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubble,
                          ScheduleKind::kInterleavedOneFOneB}) {
    GPIPE_EXPECT_THROW_WITH(make_schedule(kind, 2, 2, kMax), c10::ValueError,
                            "a schedule of 2 stages and 9223372036854775807 micro-batches has "
                            "18446744073709551614 (stage, micro-batch) cells, more than the "
                            "4294967296 a schedule can hold");
    GPIPE_EXPECT_THROW_WITH(make_schedule(kind, kMax, kMax, 2), c10::ValueError,
                            "more than the 4294967296 a schedule can hold");
  }
  GPIPE_EXPECT_THROW_WITH(interleaved_one_f_one_b_schedule(2, kMax, 4), c10::ValueError,
                          "2 workers with 9223372036854775807 stages each make "
                          "18446744073709551614 stages, more than the 4294967296 a schedule can "
                          "hold");
  GPIPE_EXPECT_THROW_WITH(zbv_schedule(1, kMax), c10::ValueError,
                          "a schedule of 2 stages and 9223372036854775807 micro-batches has "
                          "18446744073709551614 (stage, micro-batch) cells");
  GPIPE_EXPECT_THROW_WITH(zbv_schedule(kMax, 2), c10::ValueError,
                          "9223372036854775807 workers with 2 stages each make more than the "
                          "4294967296 stages a schedule can hold");
}

Schedule two_stages(std::vector<Action> worker0, std::vector<Action> worker1, int64_t m = 1) {
  Schedule schedule;
  schedule.num_workers = 2;
  schedule.num_stages = 2;
  schedule.num_microbatches = m;
  schedule.actions = {std::move(worker0), std::move(worker1)};
  return schedule;
}

TEST(ScheduleValidateTest, RejectsForwardBeforeItsInputArrives) {
  Schedule schedule = gpipe_schedule(2, 1);
  // Worker 1: RecvActivation(0, 1) Forward(0, 1) ...: drop the receive.
  ASSERT_EQ(schedule.actions[1][0], (Action{K::kRecvActivation, 0, 1}));
  schedule.actions[1].erase(schedule.actions[1].begin());
  GPIPE_EXPECT_THROW_WITH(validate(schedule), c10::ValueError,
                          "worker 1, action 0, Forward(microbatch=0, stage=1): uses the activation "
                          "of micro-batch 0 before it arrives");
}

TEST(ScheduleValidateTest, RejectsBackwardBeforeItsGradientArrives) {
  Schedule schedule = gpipe_schedule(2, 1);
  auto& w0 = schedule.actions[0];
  w0.erase(std::find(w0.begin(), w0.end(), Action{K::kRecvGradient, 0, 0}));
  GPIPE_EXPECT_THROW_WITH(validate(schedule), c10::ValueError,
                          "Backward(microbatch=0, stage=0): uses the gradient of micro-batch 0 "
                          "before it arrives");
}

TEST(ScheduleValidateTest, RejectsWeightBeforeInputGradient) {
  Schedule schedule = zb1p_schedule(2, 1);
  auto& w1 = schedule.actions[1];
  ASSERT_EQ(w1, (std::vector<Action>{{K::kRecvActivation, 0, 1},
                                     {K::kForward, 0, 1},
                                     {K::kBackwardInput, 0, 1},
                                     {K::kSendGradient, 0, 1},
                                     {K::kBackwardWeight, 0, 1}}));
  std::rotate(w1.begin() + 2, w1.begin() + 4, w1.end());
  GPIPE_EXPECT_THROW_WITH(validate(schedule), c10::ValueError,
                          "worker 1, action 2, BackwardWeight(microbatch=0, stage=1): runs before "
                          "the BackwardInput of micro-batch 0 on stage 1");
}

TEST(ScheduleValidateTest, RejectsGradientSentBeforeInputGradient) {
  Schedule schedule = zb1p_schedule(2, 1);
  auto& w1 = schedule.actions[1];
  std::swap(w1[2], w1[3]);  // SendGradient, then BackwardInput
  GPIPE_EXPECT_THROW_WITH(validate(schedule), c10::ValueError,
                          "worker 1, action 2, SendGradient(microbatch=0, stage=1): sends the "
                          "gradient of micro-batch 0 before it is computed (no Backward or "
                          "BackwardInput of it before)");
}

TEST(ScheduleValidateTest, RejectsMissingOrRepeatedWeightGradient) {
  Schedule schedule = zb1p_schedule(2, 2);
  auto& w0 = schedule.actions[0];
  w0.erase(std::find(w0.begin(), w0.end(), Action{K::kBackwardWeight, 1, 0}));
  GPIPE_EXPECT_THROW_WITH(validate(schedule), c10::ValueError,
                          "it never runs BackwardWeight(microbatch=1, stage=0)");
  schedule.actions[0].push_back({K::kBackwardWeight, 0, 0});
  GPIPE_EXPECT_THROW_WITH(validate(schedule), c10::ValueError,
                          "BackwardWeight(microbatch=0, stage=0): micro-batch 0 already has its "
                          "weight gradient on stage 0");
  // A fused backward already computed the weight gradient.
  Schedule mixed = gpipe_schedule(2, 1);
  mixed.actions[1].push_back({K::kBackwardWeight, 0, 1});
  GPIPE_EXPECT_THROW_WITH(validate(mixed), c10::ValueError,
                          "micro-batch 0 already has its weight gradient on stage 1");
}

TEST(ScheduleValidateTest, RejectsDeadlock) {
  // Worker 0 waits for a gradient before sending the activation it depends on.
  const Schedule schedule = two_stages({{K::kForward, 0, 0},
                                        {K::kRecvGradient, 0, 0},
                                        {K::kSendActivation, 0, 0},
                                        {K::kBackward, 0, 0}},
                                       {{K::kRecvActivation, 0, 1},
                                        {K::kForward, 0, 1},
                                        {K::kBackward, 0, 1},
                                        {K::kSendGradient, 0, 1}});
  GPIPE_EXPECT_THROW_WITH(validate(schedule), c10::ValueError,
                          "deadlock: worker 0 waits at action 1, RecvGradient(microbatch=0, "
                          "stage=0); worker 1 waits at action 0, RecvActivation(microbatch=0, "
                          "stage=1)");
}

TEST(ScheduleValidateTest, RejectsDuplicate) {
  Schedule schedule = gpipe_schedule(2, 1);
  schedule.actions[1].push_back({K::kSendGradient, 0, 1});
  GPIPE_EXPECT_THROW_WITH(validate(schedule), c10::ValueError,
                          "worker 1, action 4, SendGradient(microbatch=0, stage=1): micro-batch 0 "
                          "was already sent");
}

TEST(ScheduleValidateTest, RejectsDeadlockOfFullQueues) {
  // Worker 0 sends four activations before it takes a gradient; worker 1 sends two gradients
  // before it takes the third activation. Fine with room for two messages per edge; with one,
  // both wait to send.
  Schedule schedule = two_stages({}, {}, 4);
  for (int64_t i = 0; i < 4; ++i) {
    schedule.actions[0].push_back({K::kForward, i, 0});
    schedule.actions[0].push_back({K::kSendActivation, i, 0});
  }
  for (int64_t i = 0; i < 4; ++i) {
    schedule.actions[0].push_back({K::kRecvGradient, i, 0});
    schedule.actions[0].push_back({K::kBackward, i, 0});
  }
  for (int64_t round = 0; round < 2; ++round) {
    for (int64_t i = 2 * round; i < 2 * round + 2; ++i) {
      schedule.actions[1].push_back({K::kRecvActivation, i, 1});
      schedule.actions[1].push_back({K::kForward, i, 1});
    }
    for (int64_t i = 2 * round; i < 2 * round + 2; ++i) {
      schedule.actions[1].push_back({K::kBackward, i, 1});
      schedule.actions[1].push_back({K::kSendGradient, i, 1});
    }
  }
  EXPECT_NO_THROW(validate(schedule));
  EXPECT_NO_THROW(validate(schedule, ValidateOptions().queue_capacity(2)));
  GPIPE_EXPECT_THROW_WITH(validate(schedule, ValidateOptions().queue_capacity(1)), c10::ValueError,
                          "deadlock: worker 0 waits at action 7, SendActivation(microbatch=3, "
                          "stage=0); worker 1 waits at action 7, SendGradient(microbatch=1, "
                          "stage=1)");
}

TEST(ScheduleValidateTest, RejectsOutOfOrderReceive) {
  Schedule schedule = gpipe_schedule(2, 2);
  auto& w1 = schedule.actions[1];
  // Worker 1 receives micro-batch 1 first.
  ASSERT_EQ(w1[0], (Action{K::kRecvActivation, 0, 1}));
  auto second = std::find(w1.begin(), w1.end(), Action{K::kRecvActivation, 1, 1});
  ASSERT_NE(second, w1.end());
  second->microbatch = 0;
  w1[0].microbatch = 1;
  GPIPE_EXPECT_THROW_WITH(validate(schedule), c10::ValueError,
                          "worker 1, action 0, RecvActivation(microbatch=1, stage=1): the next "
                          "activation from stage 0 is of micro-batch 0, not 1");
}

TEST(ScheduleValidateTest, RejectsStageOnAnotherWorker) {
  Schedule schedule = gpipe_schedule(2, 1);
  schedule.actions[0].insert(schedule.actions[0].begin(), Action{K::kForward, 0, 1});
  GPIPE_EXPECT_THROW_WITH(validate(schedule), c10::ValueError,
                          "worker 0, action 0, Forward(microbatch=0, stage=1): stage 1 runs on "
                          "worker 1, not on worker 0");
}

TEST(ScheduleValidateTest, RejectsOutOfRange) {
  Schedule schedule = gpipe_schedule(2, 1);
  schedule.actions[0][0].microbatch = 5;
  GPIPE_EXPECT_THROW_WITH(validate(schedule), c10::ValueError,
                          "Forward(microbatch=5, stage=0): micro-batch 5 is out of range for 1");
}

TEST(ScheduleValidateTest, RejectsBackwardBeforeForward) {
  const Schedule schedule = two_stages({{K::kBackward, 0, 0}, {K::kForward, 0, 0}}, {});
  GPIPE_EXPECT_THROW_WITH(validate(schedule), c10::ValueError,
                          "worker 0, action 0, Backward(microbatch=0, stage=0): runs before the "
                          "forward of micro-batch 0 on stage 0");
}

TEST(ScheduleValidateTest, RejectsSendBeforeCompute) {
  const Schedule schedule = two_stages({{K::kSendActivation, 0, 0}}, {});
  GPIPE_EXPECT_THROW_WITH(validate(schedule), c10::ValueError,
                          "SendActivation(microbatch=0, stage=0): sends the activation of "
                          "micro-batch 0 before it is computed");
}

TEST(ScheduleValidateTest, RejectsMissingWork) {
  Schedule schedule = gpipe_schedule(2, 2);
  auto& w1 = schedule.actions[1];
  w1.erase(std::find(w1.begin(), w1.end(), Action{K::kBackward, 1, 1}));
  w1.erase(std::find(w1.begin(), w1.end(), Action{K::kSendGradient, 1, 1}));
  auto& w0 = schedule.actions[0];
  w0.erase(std::find(w0.begin(), w0.end(), Action{K::kRecvGradient, 1, 0}));
  w0.erase(std::find(w0.begin(), w0.end(), Action{K::kBackward, 1, 0}));
  GPIPE_EXPECT_THROW_WITH(validate(schedule), c10::ValueError,
                          "it never runs Backward(microbatch=1, stage=0)");
}

TEST(ScheduleValidateTest, RejectsUnreceivedMessage) {
  const Schedule schedule =
      two_stages({{K::kForward, 0, 0}, {K::kSendActivation, 0, 0}, {K::kBackward, 0, 0}},
                 {{K::kForward, 0, 1}});
  GPIPE_EXPECT_THROW_WITH(validate(schedule), c10::ValueError,
                          "Forward(microbatch=0, stage=1): uses the activation");
}

TEST(ScheduleValidateTest, RejectsSendWithoutNeighbour) {
  const Schedule schedule = two_stages({{K::kForward, 0, 0}, {K::kSendGradient, 0, 0}}, {});
  GPIPE_EXPECT_THROW_WITH(validate(schedule), c10::ValueError,
                          "SendGradient(microbatch=0, stage=0): stage 0 has no previous stage");
}

}  // namespace
}  // namespace schedule_validate_test
}  // namespace schedule
}  // namespace gpipe
