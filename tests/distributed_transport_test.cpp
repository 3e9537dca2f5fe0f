// Tests of C10dTransport between two ranks on threads of this process (a TCPStore and a Gloo
// process group over loopback): batches arrive whole in both directions, metadata and order are
// checked, and a failure recorded by one rank stops the other's waits with its name.
#include "test_util.h"

#include "launcher.h"

#include "gpipe/distributed/c10d_transport.h"
#include "gpipe/distributed/pipeline_stage.h"
#include "gpipe/memory.h"

#include <chrono>
#include <csignal>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace gpipe {
namespace distributed {
namespace distributed_transport_test {
namespace {

// Runs body(rank, group) for 2 ranks on 2 threads, each joined to the group; rethrows the first
// exception.
void run_groups(const std::function<void(int64_t, const ProcessGroup&)>& body) {
  const int port = launcher::free_port();
  std::vector<std::exception_ptr> errors(2);
  std::vector<std::thread> threads;
  for (int64_t rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        Environment env;
        env.rank = rank;
        env.world_size = 2;
        env.local_rank = rank;
        env.master_addr = "127.0.0.1";
        env.master_port = port;
        body(rank, rendezvous(env, std::chrono::seconds(20)));
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

// Runs body(rank, transport) for 2 ranks on 2 threads, 2 stages; rethrows the first exception.
void run_ranks(
    const std::function<void(int64_t, C10dTransport&)>& body,
    C10dTransportOptions options = C10dTransportOptions().timeout(std::chrono::seconds(20))) {
  run_groups([&](int64_t rank, const ProcessGroup& group) {
    C10dTransport transport(group, 2, options);
    body(rank, transport);
  });
}

void on_sigpipe(int) {}

// Gloo writes with plain writev: without this, a peer that dies mid-send kills the writer with
// SIGPIPE before it can name the peer. A handler the program installed stays.
TEST(DistributedTransportTest, RendezvousIgnoresSigpipeUnlessHandled) {
  const auto disposition = [] {
    struct sigaction current {};
    sigaction(SIGPIPE, nullptr, &current);
    return current.sa_handler;
  };
  const auto join_alone = [] {
    Environment env;  // one rank
    env.master_addr = "127.0.0.1";
    env.master_port = launcher::free_port();
    rendezvous(env, std::chrono::seconds(20));
  };
  struct sigaction saved {};
  sigaction(SIGPIPE, nullptr, &saved);
  std::signal(SIGPIPE, SIG_DFL);
  join_alone();
  EXPECT_EQ(disposition(), SIG_IGN);
  std::signal(SIGPIPE, on_sigpipe);
  join_alone();
  EXPECT_EQ(disposition(), &on_sigpipe);
  sigaction(SIGPIPE, &saved, nullptr);
}

// A rank whose store server never comes fails within the rendezvous timeout, naming the server:
// the TCPStore's own client, left to itself, retries once more after a back-off (torch 2.x).
TEST(DistributedTransportTest, RendezvousWithoutItsServerFailsWithinTheTimeout) {
  Environment env;
  env.rank = 1;
  env.world_size = 2;
  env.master_addr = "127.0.0.1";
  env.master_port = launcher::free_port();  // nobody listens there
  const auto begun = std::chrono::steady_clock::now();
  GPIPE_EXPECT_THROW_WITH(rendezvous(env, std::chrono::seconds(2)), c10::Error,
                          "timed out after 2 s: rank 1 could not reach rank 0, which serves it");
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begun).count();
  EXPECT_GE(waited, 1.9);
  EXPECT_LE(waited, 3.0);
}

// A transport moves CPU tensors over Gloo and CUDA tensors over NCCL, nothing else; CUDA needs a
// LibTorch with NCCL (the wheel's, not Debian's). A rank without a GPU defaults to the CPU.
TEST(DistributedTransportTest, DeviceIsOneItCanMove) {
  Environment env;
  env.master_addr = "127.0.0.1";
  env.master_port = launcher::free_port();
  ProcessGroup group = rendezvous(env, std::chrono::seconds(20));
  GPIPE_EXPECT_THROW_WITH(C10dTransport(group, 1, C10dTransportOptions().device(torch::kMeta)),
                          c10::ValueError, "not meta tensors");
  if (!nccl_available()) {
    GPIPE_EXPECT_THROW_WITH(
        C10dTransport(group, 1, C10dTransportOptions().device(torch::Device(torch::kCUDA, 0))),
        c10::Error, "without NCCL");
    EXPECT_THROW(new_nccl_backend(group, "x", std::chrono::seconds(1)), c10::Error);
  }
  C10dTransport transport(group, 1);
  EXPECT_EQ(transport.device(), torch::Device(torch::kCPU));
  if (!torch::cuda::is_available()) EXPECT_EQ(default_device(env), torch::Device(torch::kCPU));
}

TEST(DistributedTransportTest, BatchesArriveWholeBothWays) {
  const at::Tensor x = torch::randn({4, 3});
  const at::Tensor mask = torch::arange(4);
  const at::Tensor g = torch::randn({4, 3});
  run_ranks([&](int64_t rank, C10dTransport& transport) {
    if (rank == 0) {
      transport.send(Batch(std::vector<at::Tensor>{x, mask}), 0, 1, 0);
      const Batch grad = transport.recv(1, 0, 0);
      ASSERT_EQ(grad.size(), 2u);
      EXPECT_TRUE(testing::bitwise_equal(grad[0], g));
      EXPECT_FALSE(grad[1].defined());
      transport.flush();
    } else {
      const Batch got = transport.recv(0, 1, 0);
      ASSERT_EQ(got.size(), 2u);
      EXPECT_FALSE(got.atomic());
      EXPECT_TRUE(testing::bitwise_equal(got[0], x));
      EXPECT_TRUE(testing::bitwise_equal(got[1], mask));
      transport.send(Batch(std::vector<at::Tensor>{g, at::Tensor()}), 1, 0, 0);
      transport.flush();
    }
  });
}

// The first batch on an edge goes as a header and one message per tensor; later ones that fit
// the largest so far go as one message, into receives that expect() posts ahead. Every kind of
// tensor arrives bitwise equal either way: dtypes of 1 to 8 bytes, a scalar, an empty and an
// undefined tensor, a non-contiguous one, a smaller last batch and a larger one that needs the
// split form again.
TEST(DistributedTransportTest, LaterBatchesTravelAsOneMessageIntoPostedReceives) {
  auto batch_of = [](int64_t rows, int64_t seed) {
    torch::manual_seed(seed);
    return std::vector<at::Tensor>{torch::randn({3, rows}).t(),  // non-contiguous
                                   torch::randint(0, 100, {rows}, torch::kLong),
                                   torch::rand({rows, 5}) > 0.5,
                                   torch::randn({}, torch::kDouble),
                                   torch::empty({0, 4}),
                                   at::Tensor(),
                                   torch::randint(0, 9, {rows, 3}, torch::kInt8)};
  };
  const std::vector<int64_t> rows{4, 4, 4, 2, 6, 6};
  // Made here: both ranks are threads of this process and would race for the global generator.
  std::vector<std::vector<at::Tensor>> batches;
  for (const auto i : c10::irange(rows.size())) {
    batches.push_back(batch_of(rows[i], static_cast<int64_t>(i)));
  }
  // Messages per batch: the split form is a header plus one per non-empty defined tensor.
  const std::vector<int64_t> expected_messages{6, 1, 1, 1, 6, 1};
  run_ranks([&](int64_t rank, C10dTransport& transport) {
    transport.begin_step();
    if (rank == 1) transport.expect(0, 1, static_cast<int64_t>(rows.size()));
    for (const auto i : c10::irange(rows.size())) {
      const auto& sent = batches[i];
      if (rank == 0) {
        const int64_t before = transport.messages_sent();
        transport.send(Batch(sent), 0, 1, static_cast<int64_t>(i));
        EXPECT_EQ(transport.messages_sent() - before, expected_messages[i]) << "batch " << i;
        continue;
      }
      const Batch got = transport.recv(0, 1, static_cast<int64_t>(i));
      ASSERT_EQ(got.size(), sent.size());
      for (const auto k : c10::irange(sent.size())) {
        if (!sent[k].defined()) {
          EXPECT_FALSE(got[k].defined()) << "batch " << i << ", tensor " << k;
          continue;
        }
        EXPECT_EQ(got[k].scalar_type(), sent[k].scalar_type()) << "batch " << i << ", tensor " << k;
        EXPECT_TRUE(testing::bitwise_equal(got[k], sent[k])) << "batch " << i << ", tensor " << k;
      }
    }
    transport.flush();
  });
}

// Messages in flight: in a later step every announced receive is posted at once, on both lanes
// of an edge, so the sender's batches all arrive before the receiver takes any; it then takes
// them lane by lane, not in the order they were sent, each whole. The fourth pipeline batch is
// larger than any before: it travels split, its tensors on the edge's payload tag, and must not
// land in the receive posted for the fifth. The first step, with its window of one, teaches the
// edges their sizes.
TEST(DistributedTransportTest, ManyReceivesPostedTakeTheirOwnBatches) {
  constexpr int64_t kBatches = 8;
  const auto pipeline_batch = [](int64_t step, int64_t i) {
    const int64_t rows = step == 1 && i == 3 ? 6 : 4;
    return torch::full({rows, 3}, static_cast<double>(100 * step + i));
  };
  const auto skip_batch = [](int64_t step, int64_t i) {
    return std::vector<at::Tensor>{torch::full({2}, static_cast<float>(-100 * step - i)),
                                   torch::arange(i + 1)};
  };
  std::vector<int64_t> second_step_messages;
  run_ranks([&](int64_t rank, C10dTransport& transport) {
    for (int64_t step = 0; step < 2; ++step) {
      transport.begin_step();
      if (rank == 0) {
        for (int64_t i = 0; i < kBatches; ++i) {
          const int64_t before = transport.messages_sent();
          transport.send(Batch(pipeline_batch(step, i)), 0, 1, i);
          transport.send(Batch(skip_batch(step, i)), 0, 1, i, schedule::Lane::kSkip);
          if (step == 1) second_step_messages.push_back(transport.messages_sent() - before);
        }
        transport.flush();  // every batch received
        continue;
      }
      transport.expect(0, 1, kBatches);
      transport.expect(0, 1, kBatches, schedule::Lane::kSkip);
      // Every batch is on its way before the first is taken.
      std::this_thread::sleep_for(std::chrono::milliseconds(step == 1 ? 300 : 0));
      for (int64_t i = 0; i < kBatches; ++i) {
        const Batch got = transport.recv(0, 1, i, schedule::Lane::kSkip);
        const auto sent = skip_batch(step, i);
        ASSERT_EQ(got.size(), 2u);
        EXPECT_TRUE(testing::bitwise_equal(got[0], sent[0])) << "step " << step << ", skip " << i;
        EXPECT_TRUE(testing::bitwise_equal(got[1], sent[1])) << "step " << step << ", skip " << i;
      }
      for (int64_t i = 0; i < kBatches; ++i) {
        EXPECT_TRUE(
            testing::bitwise_equal(transport.recv(0, 1, i).tensor(), pipeline_batch(step, i)))
            << "step " << step << ", batch " << i;
      }
    }
  });
  // Both batches of each micro-batch in one message each, but the larger one: a header and its
  // tensor.
  const std::vector<int64_t> expected{2, 2, 2, 3, 2, 2, 2, 2};
  EXPECT_EQ(second_step_messages, expected);
}

// More receives announced than batches come is a mistake the next step names; the receives
// still take the batches that come later.
TEST(DistributedTransportTest, ReceivesLeftPostedAreNamed) {
  run_ranks([&](int64_t rank, C10dTransport& transport) {
    transport.begin_step();
    if (rank == 0) {
      transport.send(Batch(torch::ones({2})), 0, 1, 0);
      transport.flush();
      transport.barrier("checked", std::chrono::seconds(20));
      transport.send(Batch(torch::full({2}, 2.0)), 0, 1, 1);
      transport.send(Batch(torch::full({2}, 3.0)), 0, 1, 2);
      transport.flush();
      return;
    }
    transport.recv(0, 1, 0);
    transport.begin_step();  // the edge's first step is over; the next posts deeper
    transport.expect(0, 1, 2);
    GPIPE_EXPECT_THROW_WITH(transport.begin_step(), c10::ValueError,
                            "rank 1 announced more messages from stage 0 to stage 1 in the last "
                            "step than came: 2 receive(s) still posted");
    transport.barrier("checked", std::chrono::seconds(20));
    EXPECT_TRUE(testing::bitwise_equal(transport.recv(0, 1, 1).tensor(), torch::full({2}, 2.0)));
    EXPECT_TRUE(testing::bitwise_equal(transport.recv(0, 1, 2).tensor(), torch::full({2}, 3.0)));
  });
}

// A receive announced for the next step is posted before this step ends: a sender that starts
// the next step first has its batch taken at once (its flush returns while the receiver has not
// begun the step), and the step counts that receive among the ones it announces.
TEST(DistributedTransportTest, TheNextStepsFirstReceiveIsPostedBeforeItBegins) {
  run_ranks([&](int64_t rank, C10dTransport& transport) {
    transport.begin_step();
    if (rank == 0) {
      transport.send(Batch(torch::ones({2})), 0, 1, 0);
      transport.flush();
      transport.begin_step();
      transport.send(Batch(torch::full({2}, 2.0)), 0, 1, 0);
      transport.flush();  // without the receive posted ahead, this waits for rank 1 to ask
      transport.barrier("flushed", std::chrono::seconds(5));
      transport.send(Batch(torch::full({2}, 3.0)), 0, 1, 1);
      transport.flush();
      return;
    }
    transport.expect(0, 1, 1);
    EXPECT_TRUE(testing::bitwise_equal(transport.recv(0, 1, 0).tensor(), torch::ones({2})));
    transport.expect_in_next_step(0, 1);
    transport.barrier("flushed", std::chrono::seconds(5));
    transport.begin_step();  // the receive posted ahead is not one left over
    transport.expect(0, 1, 2);
    GPIPE_EXPECT_THROW_WITH(transport.expect_in_next_step(0, 1), c10::ValueError,
                            "rank 1 announced a message from stage 0 to stage 1 in the next step "
                            "while this step's are still expected");
    EXPECT_TRUE(testing::bitwise_equal(transport.recv(0, 1, 0).tensor(), torch::full({2}, 2.0)));
    EXPECT_TRUE(testing::bitwise_equal(transport.recv(0, 1, 1).tensor(), torch::full({2}, 3.0)));
    GPIPE_EXPECT_THROW_WITH(transport.expect_in_next_step(1, 0), c10::ValueError,
                            "rank 1 cannot receive for stage 0, which rank 0 runs");
  });
}

// Two transports over one group, each with a receive posted ahead for its next step, step in
// turns and then one after the other is gone: each takes only its own batches. Tags shared
// between them would let the receive posted for one take the other's batch.
TEST(DistributedTransportTest, TransportsOverOneGroupKeepTheirMessagesApart) {
  const auto options = C10dTransportOptions().timeout(std::chrono::seconds(5));
  run_groups([&](int64_t rank, const ProcessGroup& group) {
    auto first = std::make_unique<C10dTransport>(group, 2, options);
    C10dTransport second(group, 2, options);
    // One step of `transport` carrying `value` from rank 0 to rank 1, then a receive posted for
    // its next step.
    const auto step = [&](C10dTransport& transport, double value, const char* what) {
      transport.begin_step();
      if (rank == 0) {
        transport.send(Batch(torch::full({2}, value)), 0, 1, 0);
        transport.flush();
        return;
      }
      transport.expect(0, 1, 1);
      EXPECT_TRUE(testing::bitwise_equal(transport.recv(0, 1, 0).tensor(), torch::full({2}, value)))
          << what;
      transport.expect_in_next_step(0, 1);
    };
    step(*first, 1, "the first transport's first step");
    step(second, 2, "the second transport's first step, in turn");
    step(*first, 3, "the first transport's second step");
    step(second, 4, "the second transport's second step");
    first->barrier("both stepped", std::chrono::seconds(5));
    first.reset();  // its receive stays posted for a step that never comes
    step(second, 5, "the second transport's step after the first is gone");
    C10dTransport third(group, 2, options);
    step(third, 6, "a third transport's step");
  });
}

// A sent activation's message (a packed copy of it) goes once its gradient comes back, not at
// the end of the step: in the second step (the first teaches the edges their sizes, so that the
// batches then travel packed, as one message each), after the gradients of 4 activations of
// 1 MiB came back, the sender holds none of their messages, though it has not flushed.
TEST(DistributedTransportTest, AnActivationsMessageGoesWhenItsGradientComesBack) {
  memory::install_tracking_cpu_allocator();
  constexpr int64_t kMicroBatches = 4;
  const at::Tensor activation = torch::ones({256, 1024});  // 1 MiB
  int64_t held = -1;
  run_ranks([&](int64_t rank, C10dTransport& transport) {
    for (int step = 0; step < 2; ++step) {
      transport.begin_step();
      if (rank == 1) {
        transport.expect(0, 1, kMicroBatches);
        for (int64_t i = 0; i < kMicroBatches; ++i) {
          transport.send(Batch(transport.recv(0, 1, i).tensor() * 2), 1, 0, i);
        }
        transport.flush();
        continue;
      }
      transport.expect(1, 0, kMicroBatches);
      const memory::ScopedWorkerTag tag(memory::kMaxTags - 1);
      const int64_t before = memory::cpu_worker_current_bytes(memory::kMaxTags - 1);
      for (int64_t i = 0; i < kMicroBatches; ++i) transport.send(Batch(activation), 0, 1, i);
      for (int64_t i = 0; i < kMicroBatches; ++i) {
        EXPECT_TRUE(testing::bitwise_equal(transport.recv(1, 0, i).tensor(), activation * 2));
      }
      held = memory::cpu_worker_current_bytes(memory::kMaxTags - 1) - before;
      transport.flush();
    }
  });
  // Held at most: the receives posted for the gradients, none larger than one message.
  EXPECT_LT(held, kMicroBatches * static_cast<int64_t>(activation.nbytes())) << held;
}

// 1F1B's exchange: stage 0 sends the next activation once a gradient came. Each activation says
// how many gradients stage 0 has, so stage 1 holds the message of its last gradient only, not
// one per micro-batch until flush().
TEST(DistributedTransportTest, AGradientsMessageGoesWhenAnActivationSaysItCame) {
  memory::install_tracking_cpu_allocator();
  constexpr int64_t kMicroBatches = 8;
  const at::Tensor activation = torch::ones({256, 1024});  // 1 MiB
  int64_t held = -1;
  run_ranks([&](int64_t rank, C10dTransport& transport) {
    for (int step = 0; step < 2; ++step) {
      transport.begin_step();
      if (rank == 0) {
        transport.expect(1, 0, kMicroBatches);
        transport.send(Batch(activation), 0, 1, 0);
        for (int64_t i = 0; i < kMicroBatches; ++i) {
          EXPECT_TRUE(testing::bitwise_equal(transport.recv(1, 0, i).tensor(), activation * 2));
          if (i + 1 < kMicroBatches) transport.send(Batch(activation), 0, 1, i + 1);
        }
        transport.flush();
        continue;
      }
      transport.expect(0, 1, kMicroBatches);
      const memory::ScopedWorkerTag tag(memory::kMaxTags - 1);
      const int64_t before = memory::cpu_worker_current_bytes(memory::kMaxTags - 1);
      for (int64_t i = 0; i < kMicroBatches; ++i) {
        transport.send(Batch(transport.recv(0, 1, i).tensor() * 2), 1, 0, i);
      }
      held = memory::cpu_worker_current_bytes(memory::kMaxTags - 1) - before;
      transport.flush();
    }
  });
  // The last gradient's message, and less than another.
  EXPECT_GE(held, static_cast<int64_t>(activation.nbytes())) << held;
  EXPECT_LT(held, 2 * static_cast<int64_t>(activation.nbytes())) << held;
}

// The tags of 1024 transports of up to 1022 stages fit in a Gloo tag; more are refused.
TEST(DistributedTransportTest, TagRangesThatDoNotFitAreRefused) {
  Environment env;  // one rank
  env.master_addr = "127.0.0.1";
  env.master_port = launcher::free_port();
  const ProcessGroup group = rendezvous(env, std::chrono::seconds(20));
  GPIPE_EXPECT_THROW_WITH(C10dTransport(group, 1023), c10::ValueError,
                          "a transport carries at most 1022 stages, but got 1023");
  *group.transports = 1024;
  GPIPE_EXPECT_THROW_WITH(C10dTransport(group, 2), c10::ValueError,
                          "at most 1024 transports fit in one process group (each has its own "
                          "tags), but this is number 1025: rendezvous again for more");
}

TEST(DistributedTransportTest, ExpectRejectsBadArguments) {
  run_ranks([&](int64_t rank, C10dTransport& transport) {
    if (rank == 1) {
      GPIPE_EXPECT_THROW_WITH(transport.expect(0, 1, -1), c10::ValueError,
                              "count must be non-negative, but got -1");
      GPIPE_EXPECT_THROW_WITH(transport.expect(1, 0, 1), c10::ValueError,
                              "rank 1 cannot receive for stage 0, which rank 0 runs");
    }
  });
}

// A value's receive posted ahead takes the value; recv_from_rank returns its buffer.
TEST(DistributedTransportTest, ValueReceivePostedAhead) {
  const at::Tensor value = torch::tensor({1.5, 2.0}, torch::kDouble);
  run_ranks([&](int64_t rank, C10dTransport& transport) {
    if (rank == 0) {
      transport.send_to_rank(value, 1);
      transport.flush();
      return;
    }
    const at::Tensor posted = at::zeros({2}, at::kDouble);
    transport.post_recv_from_rank(0, posted);
    GPIPE_EXPECT_THROW_WITH(transport.post_recv_from_rank(0, at::zeros({2}, at::kDouble)),
                            c10::ValueError, "a receive from rank 0 is already posted");
    const at::Tensor got = transport.recv_from_rank(0, at::zeros({2}, at::kDouble));
    EXPECT_TRUE(got.is_same(posted));
    EXPECT_TRUE(testing::bitwise_equal(got, value));
  });
}

TEST(DistributedTransportTest, ShapeMismatchFailsOnBothSides) {
  std::string sender, receiver;
  run_ranks([&](int64_t rank, C10dTransport& transport) {
    try {
      if (rank == 0) {
        transport.send(Batch(torch::zeros({2, 8})), 0, 1, 0);
        transport.send(Batch(torch::zeros({2, 9}, torch::kDouble)), 0, 1, 1);
      } else {
        transport.recv(0, 1, 0);
        transport.recv(0, 1, 1);
      }
      ADD_FAILURE() << "rank " << rank << " did not fail";
    } catch (const c10::Error& error) {
      transport.report_failure(error.what_without_backtrace());
      (rank == 0 ? sender : receiver) = error.what_without_backtrace();
    }
  });
  const std::string expected =
      "stage 0 sends to stage 1 for micro-batch 1 an activation (Double[2, 9]), but the edge "
      "agreed on (Float[*, 8]) with its first message";
  EXPECT_THAT(sender, ::testing::HasSubstr(expected));
  EXPECT_THAT(receiver, ::testing::HasSubstr("rank 0 failed: " + expected));
}

TEST(DistributedTransportTest, ShapesMayChangeBetweenSteps) {
  run_ranks([&](int64_t rank, C10dTransport& transport) {
    for (const int64_t width : {8, 5}) {
      transport.begin_step();
      for (int64_t i = 0; i < 2; ++i) {
        if (rank == 0) {
          transport.send(Batch(torch::full({2, width}, static_cast<double>(i))), 0, 1, i);
        } else {
          EXPECT_TRUE(testing::bitwise_equal(transport.recv(0, 1, i).tensor(),
                                             torch::full({2, width}, static_cast<double>(i))));
        }
      }
      transport.flush();
    }
  });
}

TEST(DistributedTransportTest, OutOfOrderMessageIsNamed) {
  std::string receiver;
  run_ranks([&](int64_t rank, C10dTransport& transport) {
    try {
      if (rank == 0) {
        transport.send(Batch(torch::zeros({2, 8})), 0, 1, 0);
        transport.flush();
      } else {
        transport.recv(0, 1, 1);
      }
    } catch (const c10::Error& error) {
      transport.report_failure(error.what_without_backtrace());
      if (rank == 1) receiver = error.what_without_backtrace();
    }
  });
  EXPECT_THAT(receiver,
              ::testing::HasSubstr("stage 1 expected the activation of micro-batch 1 from stage 0 "
                                   "(rank 0) to stage 1, but got the activation of micro-batch 0"));
}

TEST(DistributedTransportTest, FailureOfOneRankStopsTheOther) {
  std::string waiting;
  double seconds = 0;
  run_ranks([&](int64_t rank, C10dTransport& transport) {
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      transport.report_failure("out of coffee");
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      transport.recv(1, 0, 0);
    } catch (const c10::Error& error) {
      waiting = error.what_without_backtrace();
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  EXPECT_THAT(waiting, ::testing::HasSubstr("rank 1 failed: out of coffee"));
  EXPECT_THAT(waiting, ::testing::HasSubstr("rank 0 stopped waiting for the gradient of "
                                            "micro-batch 0 from stage 1 (rank 1) to stage 0"));
  EXPECT_LT(seconds, 5.0);  // the poll interval, not the 20 s timeout
}

}  // namespace
}  // namespace distributed_transport_test
}  // namespace distributed
}  // namespace gpipe
