// The time source of the engine and the serving code, injectable: the real steady clock, or a
// manual one that a test or the serving simulator advances, so that both drive the same code on
// the same time. Seconds as double, from an arbitrary origin.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

namespace specula {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual double NowSeconds() const = 0;
  // Waits `seconds` (a manual clock advances instead).
  virtual void SleepFor(double seconds) = 0;
};

// std::chrono::steady_clock. Thread-safe; one instance serves everyone.
class SteadyClock final : public Clock {
 public:
  double NowSeconds() const override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  void SleepFor(double seconds) override {
    if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  }
};

inline Clock* DefaultClock() {
  static SteadyClock clock;
  return &clock;
}

// Time that moves only when told: Advance, or SleepFor (which advances instead of waiting).
class ManualClock final : public Clock {
 public:
  explicit ManualClock(double start_seconds = 0) : now_(start_seconds) {}
  double NowSeconds() const override { return now_.load(std::memory_order_relaxed); }
  void SleepFor(double seconds) override { Advance(seconds); }
  void Advance(double seconds) {
    double t = now_.load(std::memory_order_relaxed);
    while (!now_.compare_exchange_weak(t, t + std::max(seconds, 0.0), std::memory_order_relaxed)) {
    }
  }

 private:
  std::atomic<double> now_;
};

}  // namespace specula
