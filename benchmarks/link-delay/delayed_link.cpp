#include "delayed_link.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>

namespace gpipe {
namespace bench {
namespace {

using Clock = std::chrono::steady_clock;

std::string error_text(int error) { return std::strerror(error); }

// Runs `command` under sh; returns its exit code (-1 where it did not exit) and its output.
int run(const std::string& command, std::string* output) {
  std::FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) {
    if (output) *output = "popen: " + error_text(errno);
    return -1;
  }
  char buffer[1024];
  std::string text;
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) text.append(buffer, n);
  const int status = pclose(pipe);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (output) *output = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Moves the calling thread (only it: network namespaces are per thread) into namespace `name`.
bool enter(const std::string& name, std::string* error) {
  const std::string path = "/run/netns/" + name;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
    *error = (fd < 0 ? "open(" : "setns(") + path + "): " + error_text(errno);
    if (fd >= 0) close(fd);
    return false;
  }
  close(fd);
  return true;
}

// The value of sysctl `name` in this process's namespace; empty where it cannot be read.
std::string read_sysctl(const std::string& name) {
  std::string output;
  return run("sysctl -n " + name, &output) == 0 ? output : "";
}

// Waits up to a second for `fd` to be readable.
bool readable(int fd) {
  pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, 1000) == 1;
}

}  // namespace

DelayedLink::DelayedLink(std::chrono::microseconds delay) {
  set_delay(delay);
  const int id = static_cast<int>(getpid());
  name_ = "gpipe-bench-" + std::to_string(id);
  subnet_ = "10.214." + std::to_string(id % 250) + ".";
  // At most 15 characters (IFNAMSIZ - 1).
  for (int h = 0; h < 2; ++h) {
    interfaces_.push_back("gpb" + std::to_string(id % 100000) + "t" + std::to_string(h));
  }
  stop_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_ < 0) {
    failure_ = "eventfd: " + error_text(errno);
    return;
  }
  bool made = make_tap(0) && make_tap(1);
  for (int h = 0; h < 2 && made; ++h) {
    made = shell("ip netns add " + host(h));
    namespaces_[h] = made;
  }
  for (int h = 0; h < 2 && made; ++h) {
    // The TAP's file descriptor keeps working after the device moves: it is bound to the
    // device, not to a namespace.
    const std::string in = "ip -n " + host(h) + " ";
    made = shell("ip link set " + interface(h) + " netns " + host(h)) &&
           shell(in + "addr add " + address(h) + "/24 dev " + interface(h)) &&
           shell(in + "link set " + interface(h) + " mtu " + std::to_string(kMtu) + " up") &&
           shell(in + "link set lo up");
  }
  if (!made) {
    remove();
    return;
  }
  for (int d = 0; d < 2; ++d) threads_.emplace_back([this, d] { forward(d); });
}

DelayedLink::~DelayedLink() { remove(); }

void DelayedLink::set_delay(std::chrono::microseconds delay) {
  delay_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(delay).count();
}

std::chrono::microseconds DelayedLink::delay() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::nanoseconds(delay_ns_.load()));
}

bool DelayedLink::set_congestion_control(const std::string& name, std::string* error) const {
  for (int h = 0; h < 2; ++h) {
    std::string output;
    if (run("ip netns exec " + host(h) + " sysctl -qw net.ipv4.tcp_congestion_control=" + name,
            &output) != 0) {
      *error = "cannot set TCP congestion control '" + name + "' in " + host(h) + ": " + output +
               " (available: " + read_sysctl("net.ipv4.tcp_available_congestion_control") + ")";
      return false;
    }
  }
  return true;
}

std::string DelayedLink::congestion_control() const {
  std::string output;
  return run("ip netns exec " + host(0) + " sysctl -n net.ipv4.tcp_congestion_control", &output) ==
                 0
             ? output
             : "";
}

bool DelayedLink::make_tap(int h) {
  const int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    failure_ = "cannot open /dev/net/tun: " + error_text(errno) +
               " (it needs the tun driver, and root or CAP_NET_ADMIN)";
    return false;
  }
  ifreq request{};
  request.ifr_flags = IFF_TAP | IFF_NO_PI;  // Ethernet frames, with no packet-info header
  std::strncpy(request.ifr_name, interface(h).c_str(), IFNAMSIZ - 1);
  if (ioctl(fd, TUNSETIFF, &request) != 0) {
    failure_ = "ioctl(TUNSETIFF) for TAP device " + interface(h) + ": " + error_text(errno) +
               " (it needs root or CAP_NET_ADMIN)";
    close(fd);
    return false;
  }
  taps_[h] = fd;  // not persistent: closing it removes the device
  return true;
}

bool DelayedLink::shell(const std::string& command) {
  std::string output;
  const int code = run(command, &output);
  if (code == 0) return true;
  failure_ = "`" + command + "` failed (exit " + std::to_string(code) + ")" +
             (output.empty() ? "" : ": " + output) +
             (code == 127 ? " (it needs iproute2's ip)" : "");
  return false;
}

void DelayedLink::remove() {
  if (stop_ >= 0) {
    const uint64_t one = 1;
    if (write(stop_, &one, sizeof(one)) != sizeof(one)) std::perror("DelayedLink: eventfd");
  }
  for (auto& thread : threads_) thread.join();
  threads_.clear();
  for (int& tap : taps_) {
    if (tap >= 0) close(tap);  // removes the device, in whichever namespace it is
    tap = -1;
  }
  for (int h = 0; h < 2; ++h) {
    std::string output;
    if (namespaces_[h] && run("ip netns del " + host(h), &output) != 0) {
      std::fprintf(stderr, "DelayedLink: `ip netns del %s` failed: %s\n", host(h).c_str(),
                   output.c_str());
    }
    namespaces_[h] = false;
  }
  if (stop_ >= 0) close(stop_);
  stop_ = -1;
}

void DelayedLink::forward(int direction) {
  // Wake when a frame is due, not up to the default 50 us slack later.
  prctl(PR_SET_TIMERSLACK, 1UL);
  struct Frame {
    Clock::time_point due;
    std::vector<char> bytes;
  };
  std::deque<Frame> queue;  // FIFO: frames leave in the order they came
  std::vector<char> buffer(kMtu + 64);
  const int in = taps_[direction], out = taps_[1 - direction];
  pollfd fds[2] = {{in, POLLIN, 0}, {stop_, POLLIN, 0}};
  const auto send = [&](const char* bytes, size_t size) {
    // A failed write (the other side down) loses the frame, as a link would.
    if (write(out, bytes, size) == static_cast<ssize_t>(size)) ++forwarded_[direction];
  };
  for (;;) {
    auto now = Clock::now();
    while (!queue.empty() && queue.front().due <= now) {
      send(queue.front().bytes.data(), queue.front().bytes.size());
      queue.pop_front();
    }
    timespec timeout{}, *wait = nullptr;  // none: until a frame or the stop comes
    if (!queue.empty()) {
      const auto left =
          std::chrono::duration_cast<std::chrono::nanoseconds>(queue.front().due - now).count();
      timeout.tv_sec = static_cast<time_t>(left / 1000000000);
      timeout.tv_nsec = static_cast<long>(left % 1000000000);
      wait = &timeout;
    }
    if (ppoll(fds, 2, wait, nullptr) < 0 && errno != EINTR) {
      std::perror("DelayedLink: ppoll");
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents & (POLLERR | POLLHUP | POLLNVAL)) {
      fds[0].fd = -1;  // the device is gone: forward what is queued, read no more
    } else if (fds[0].revents & POLLIN) {
      // Everything that is ready now (the descriptor does not block).
      for (ssize_t n; (n = read(in, buffer.data(), buffer.size())) > 0;) {
        const auto arrival = Clock::now();
        const std::chrono::nanoseconds delay(delay_ns_.load());
        if (delay.count() == 0 && queue.empty()) {
          send(buffer.data(), static_cast<size_t>(n));
        } else if (queue.size() >= kMaxQueued) {
          ++dropped_[direction];
        } else {
          queue.push_back({arrival + delay, std::vector<char>(buffer.data(), buffer.data() + n)});
        }
      }
    }
  }
}

double DelayedLink::round_trip_ms(int pings, std::string* error) const {
  std::string why;
  std::vector<double> times;
  // In a thread of its own: it enters the namespaces, and sockets stay in the namespace they
  // were made in.
  std::thread([&] {
    int server = -1, client = -1;
    sockaddr_in address{};
    socklen_t length = sizeof(address);
    address.sin_family = AF_INET;
    if (!enter(host(1), &why)) return;
    server = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    inet_pton(AF_INET, this->address(1).c_str(), &address.sin_addr);
    if (server < 0 || bind(server, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        getsockname(server, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      why = "UDP echo on " + this->address(1) + ": " + error_text(errno);
    } else if (enter(host(0), &why)) {
      client = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      if (client < 0 ||
          connect(client, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
        why = "UDP socket to " + this->address(1) + ": " + error_text(errno);
      }
    }
    char datagram[64] = {};
    // One more first: it resolves the peer's hardware address (ARP), which the others skip.
    for (int k = -1; k < pings && why.empty(); ++k) {
      const auto start = Clock::now();
      sockaddr_in from{};
      socklen_t from_length = sizeof(from);
      ssize_t got = -1;
      if (send(client, datagram, sizeof(datagram), 0) == sizeof(datagram) && readable(server) &&
          (got = recvfrom(server, datagram, sizeof(datagram), 0, reinterpret_cast<sockaddr*>(&from),
                          &from_length)) > 0 &&
          sendto(server, datagram, static_cast<size_t>(got), 0, reinterpret_cast<sockaddr*>(&from),
                 from_length) == got &&
          readable(client) && recv(client, datagram, sizeof(datagram), 0) > 0) {
        if (k >= 0) {
          times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
        }
      } else {
        why = "no UDP echo from " + this->address(1) + " within 1 s";
      }
    }
    if (server >= 0) close(server);
    if (client >= 0) close(client);
  }).join();
  if (!why.empty() || times.empty()) {
    if (error) *error = why.empty() ? "no pings" : why;
    return -1;
  }
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  return n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
}

}  // namespace bench
}  // namespace gpipe
