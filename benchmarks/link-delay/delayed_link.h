// A network link with a fixed one-way delay between two network namespaces, made in user space:
// a TAP device in each namespace, and a thread per direction that reads each frame from one
// TAP and writes it to the other once the delay has passed. It stands in for `tc qdisc ... netem
// delay`, which kernels without the sch_netem module do not have. Plain POSIX and C++17 (no
// LibTorch), so that it can be tried on its own; needs root (CAP_NET_ADMIN), /dev/net/tun and
// iproute2's `ip`.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace gpipe {
namespace bench {

/// Two hosts, namespaces "gpipe-bench-<pid>-0" and "-1", each with a TAP device (interface(h),
/// address(h) = 10.214.<pid % 250>.<h + 1>/24), joined by a link that delays every frame by
/// delay() in each direction, keeping their order. Made by the constructor; where something
/// cannot be made, failure() says what (the command or system call, and why) and nothing is
/// left behind. The destructor stops the link and removes the namespaces and devices.
class DelayedLink {
 public:
  explicit DelayedLink(std::chrono::microseconds delay = std::chrono::microseconds(0));
  ~DelayedLink();
  DelayedLink(const DelayedLink&) = delete;
  DelayedLink& operator=(const DelayedLink&) = delete;

  /// Empty when the link is up; else why it is not.
  const std::string& failure() const { return failure_; }

  /// The one-way delay of frames read from now on (frames already queued keep theirs).
  void set_delay(std::chrono::microseconds delay);
  std::chrono::microseconds delay() const;

  /// The TCP congestion control of connections made in the two hosts from now on (the
  /// namespaces' net.ipv4.tcp_congestion_control, which starts as the machine's own). False,
  /// with `error` set, where the kernel has no such algorithm.
  bool set_congestion_control(const std::string& name, std::string* error) const;
  /// Host 0's, as the kernel names it; empty where it cannot be read.
  std::string congestion_control() const;

  /// Host h's namespace (for `ip netns exec`), its interface and its address.
  std::string host(int h) const { return name_ + "-" + std::to_string(h); }
  const std::string& interface(int h) const { return interfaces_[h]; }
  std::string address(int h) const { return subnet_ + std::to_string(h + 1); }

  /// Frames forwarded and dropped (the queue of a direction holds at most kMaxQueued frames, as
  /// a real link's buffer does), both directions together.
  uint64_t forwarded() const { return forwarded_[0] + forwarded_[1]; }
  uint64_t dropped() const { return dropped_[0] + dropped_[1]; }

  /// The median round trip of `pings` UDP datagrams from host 0 to an echo on host 1, in ms;
  /// negative, with `error` set, where it could not be measured.
  double round_trip_ms(int pings, std::string* error = nullptr) const;

  static constexpr size_t kMaxQueued = 65536;
  /// The TAPs' MTU: large frames, so that the user-space forwarding handles few of them.
  static constexpr int kMtu = 65000;

 private:
  void forward(int direction);  // the thread that moves frames from TAP d to TAP 1 - d
  bool make_tap(int h);
  bool shell(const std::string& command);  // false, with failure_ set, where it fails
  void remove();

  std::string name_, subnet_, failure_;
  std::vector<std::string> interfaces_;
  int taps_[2] = {-1, -1};
  int stop_ = -1;  // an eventfd: readable once the threads are to stop
  bool namespaces_[2] = {false, false};
  std::atomic<int64_t> delay_ns_{0};
  std::atomic<uint64_t> forwarded_[2] = {{0}, {0}}, dropped_[2] = {{0}, {0}};
  std::vector<std::thread> threads_;
};

}  // namespace bench
}  // namespace gpipe
