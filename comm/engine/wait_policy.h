// How a waiting collective spends its time: spin, then yield, then sleep.
// The constants were measured; each comment says against what.
#pragma once

#include <chrono>

namespace tandem {

// Waiting has three phases, so that a short wait stays fast and a long one
// leaves the core to the threads that have work (the backward pass):
//  - spin: poll (UCX: progress the worker; shared memory: re-read a flag);
//  - UCX: arm the worker and sleep on its event fd, woken by the next message;
//    shared memory, which has no event to sleep on: sched_yield a while, then
//    sleep kIdleSleep per turn.
// Ranks outnumber cores: the rank we wait for may need our core, so yield soon
// (16 spins measured 2-3x faster than 256 for small all-reduces, 4 ranks on 2 cores).
constexpr unsigned kSpinsBeforeYield = 16;
// UCX waits spin this long before sleeping on the event fd...
constexpr auto kUcxSpin = std::chrono::microseconds(40);
// Send/recv through the shared-memory mailbox, ranks no more than cores:
// after the spin, yield for this long before sleeping on the doorbell. On a
// shared VM a core that goes idle may not run the sleeper again for 10-25 ms
// whatever its timeout (a sched_switch trace: a futex sleep of at most 1 ms
// lasting 23.7 ms, its core idle throughout); a yield with nothing else to run
// keeps the core, and gives it to a thread that has work. 16 MiB exchanges,
// 2 ranks: 2 launches of 12 had a call of 13-16 ms (of about 2) before this
// window, none after. MPI's and UCX's waits spin throughout.
constexpr auto kMailboxYieldWindow = std::chrono::milliseconds(5);
// ...unless the worker made progress this recently: then the transfer is
// streaming and a sleep would leave the socket idle (over a 1 Gbit/s TCP link
// sleeping cost 10-25 % of the bandwidth, 2-16 MiB all-reduces). Measured:
// 1 ms keeps a streaming TCP transfer polled; a peer that is not sending lets
// the wait sleep after it.
constexpr auto kUcxBusyWindow = std::chrono::microseconds(1000);
constexpr auto kUcxSleepSlice = std::chrono::microseconds(1000);
// Shared-memory waits: pause this many turns (tens of microseconds), then yield
// for kIdleYieldWindow, then sleep kIdleSleep per turn; once the wait has lasted
// kIdleLongWait (the peer is late, not slow) kIdleLongSleep, which costs at
// most that much latency on a wait already a hundred times longer.
// The yield window must outlast a peer's sleep (kIdleSleep plus the kernel's
// 50 us timer slack): with 64 yields (~30 us) a rank waiting on a sleeping
// peer fell asleep itself, and two ranks could stay in that state for good,
// every small all-reduce taking ~50 us instead of ~1 (2 ranks, 4 KiB).
constexpr unsigned kIdleSpins = 2048;
// The first turns re-read the flag without a pause: a pause lasts about as
// long as a cache line takes to cross cores, so the flag's arrival waited for
// the pause to end (2 ranks, medians of 5-6 alternating launches: 8 B
// all-to-all 0.54 -> 0.50 us, all-reduce 0.62 -> 0.53; 4 KiB and up level).
constexpr unsigned kSpinsWithoutPause = 16;
// While pausing, yield every this many turns (a few microseconds): a peer that
// the scheduler put on this rank's core runs only when this rank lets it. Two
// ranks on two cores stay that way for seconds once a passing load brings them
// together (2 ranks, 4 KiB: ~50 us per all-reduce instead of ~1).
constexpr unsigned kIdlePauseRun = 64;
constexpr auto kIdleYieldWindow = std::chrono::microseconds(250);
constexpr auto kIdleLongWait = std::chrono::milliseconds(20);
constexpr auto kIdleSleep = std::chrono::microseconds(50);
constexpr auto kIdleLongSleep = std::chrono::microseconds(250);

}  // namespace tandem
