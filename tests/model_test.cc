// The scale model: closed forms of each algorithm, the calibration fit, the
// file round trip, and the CLI end to end (calibrate on 2 ranks, predict, validate).
#include "tandem/bench/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "command.h"
#include "tandem/errors.h"

namespace tandem::bench {
namespace {

Calibration example() {
  Calibration c;
  c.cores = 2;
  c.gamma = 0.1e-9;
  c.shm.alpha = 2e-6;
  c.shm.beta = {{4096, 0.05e-9}, {1 << 20, 0.05e-9}, {64 << 20, 0.2e-9}};
  c.shm.traffic = {{4096, 5.0}, {64 << 20, 3.0}};
  c.links["wire"] = Link{10e-6, 8e-9, false, {}, 0, {}, {}};  // 1 Gbit/s
  c.links["cpu"] = Link{20e-6, 1e-9, true, {}, 0, {}, {}};
  return c;
}

TEST(Model, RingClosedForm) {
  const Calibration c = example();
  const Link& l = c.links.at("wire");
  for (int p : {2, 3, 8, 1000}) {
    const double n = 64 << 20;
    // Wire-bound: the reduction hides behind the transfer (gamma < beta).
    const double expected = 2.0 * (p - 1) * l.alpha + 2.0 * (p - 1) / p * n * l.beta;
    EXPECT_NEAR(predict(c, l, Topology{p, 1}, Algorithm::ring, n), expected, expected * 1e-12) << p;
  }
}

TEST(Model, CpuBoundRingPaysForTheReductionToo) {
  const Calibration c = example();
  const Link& l = c.links.at("cpu");
  const double n = 64 << 20, p = 4;
  const double expected = 2 * (p - 1) * l.alpha + (p - 1) / p * n * (2 * l.beta + c.gamma);
  EXPECT_NEAR(predict(c, l, Topology{4, 1}, Algorithm::ring, n), expected, expected * 1e-12);
}

TEST(Model, RecursiveDoublingRounds) {
  const Calibration c = example();
  const Link& l = c.links.at("wire");
  const double n = 1024, round = l.alpha + n * l.beta + n * c.gamma;
  EXPECT_NEAR(predict(c, l, Topology{8, 1}, Algorithm::recursive_doubling, n), 3 * round, 1e-15);
  // 6 ranks: fold to 4 (2 rounds) plus the fold and unfold, whose bytes share
  // the wire's two directions: one message's transfer.
  EXPECT_NEAR(predict(c, l, Topology{6, 1}, Algorithm::recursive_doubling, n), 4 * round - n * l.beta, 1e-15);
  // A cpu-bound link's cores move both.
  const Link& cpu = c.links.at("cpu");
  const double cpu_round = cpu.alpha + n * cpu.beta + n * c.gamma;
  EXPECT_NEAR(predict(c, cpu, Topology{6, 1}, Algorithm::recursive_doubling, n), 4 * cpu_round, 1e-15);
}

TEST(Model, HierarchicalMovesLessOverTheWireThanTheFlatRing) {
  const Calibration c = example();
  const Link& l = c.links.at("wire");
  const Topology t{2, 4};
  const double n = 16 << 20;
  const double flat = predict(c, l, t, Algorithm::ring, n);
  const double hier = predict(c, l, t, Algorithm::hierarchical, n);
  // The NIC carries 2(p-1)/p N flat and 2(H-1)/H N hierarchical: 1.75 N against 1 N.
  const double wire_flat = 2.0 * 7 / 8 * n * l.beta, wire_hier = 1.0 * n * l.beta;
  EXPECT_GT(flat, wire_flat);
  EXPECT_GT(hier, wire_hier);
  EXPECT_LT(hier, flat);
  EXPECT_EQ(fastest(c, l, t, n), Algorithm::hierarchical);
  // Latency-bound: recursive doubling wins tiny messages.
  EXPECT_EQ(fastest(c, l, Topology{64, 1}, 8), Algorithm::recursive_doubling);
}

TEST(Model, CpuBoundLinksSlowDownPastTheCores) {
  const Calibration c = example();
  const Link& l = c.links.at("cpu");
  Topology alone{4, 1};
  Topology shared{4, 1};
  shared.ranks_on_cores = 4;  // four "hosts" on one 2-core machine
  const double n = 64 << 20;
  const double t1 = predict(c, l, alone, Algorithm::ring, n), t2 = predict(c, l, shared, Algorithm::ring, n);
  EXPECT_GT(t2, 1.9 * t1);
  EXPECT_LT(t2, 2.0 * t1 + 1e-9);
}

TEST(Model, OversubscribedStepVanishesWithinTheCores) {
  const StepTable step = {{1.0, 10e-6}, {1.5, 60e-6}, {2.0, 70e-6}};
  EXPECT_EQ(oversubscribed_step(step, 0.5), 0);
  EXPECT_EQ(oversubscribed_step(step, 1.0), 0);
  EXPECT_NEAR(oversubscribed_step(step, 1.25), 25e-6, 1e-12);  // halfway from (1, 0) to (1.5, 50 us)
  EXPECT_NEAR(oversubscribed_step(step, 1.5), 50e-6, 1e-12);
  EXPECT_NEAR(oversubscribed_step(step, 2.0), 60e-6, 1e-12);
  EXPECT_NEAR(oversubscribed_step(step, 3.0), 120e-6, 1e-12);  // beyond: in proportion to rho - 1
  EXPECT_EQ(oversubscribed_step({{0.25, 5e-6}}, 4.0), 0);      // nothing measured past the cores
  EXPECT_EQ(oversubscribed_step({}, 4.0), 0);
  // The unshared step is the entry at the most ranks per core up to 1.
  EXPECT_NEAR(oversubscribed_step({{0.5, 4e-6}, {2.0, 10e-6}}, 2.0), 6e-6, 1e-12);
}

TEST(Model, OversubscribedStepsAddToEverySynchronisation) {
  Calibration c = example();
  c.shm.step = {{1.0, 1e-6}, {2.0, 5e-6}};
  Link l = c.links.at("cpu");  // the cores move its bytes: the waits add to the transfers
  l.step = {{1.0, 10e-6}, {2.0, 70e-6}};
  const double n = 4096;
  // Shared memory, 4 ranks on 2 cores: two rendezvous of 4 us more each.
  Topology four{1, 4};
  const Calibration plain = example();
  EXPECT_NEAR(
      predict(c, Link{}, four, Algorithm::shared_memory, n) - predict(plain, Link{}, four, Algorithm::shared_memory, n),
      8e-6, 1e-12);
  // 4 namespaces on one 2-core machine: a ring's 6 steps, recursive doubling's 2 rounds, 60 us more each.
  Topology shared{4, 1};
  shared.ranks_on_cores = 4;
  const Link bare = c.links.at("cpu");
  EXPECT_NEAR(predict(c, l, shared, Algorithm::ring, n) - predict(c, bare, shared, Algorithm::ring, n), 6 * 60e-6,
              1e-12);
  EXPECT_NEAR(predict(c, l, shared, Algorithm::recursive_doubling, n) -
                  predict(c, bare, shared, Algorithm::recursive_doubling, n),
              2 * 60e-6, 1e-12);
  // 3 namespaces: only 2 ranks run in each of recursive doubling's 3 rounds, within the cores.
  Topology three{3, 1};
  three.ranks_on_cores = 3;
  EXPECT_NEAR(predict(c, l, three, Algorithm::recursive_doubling, n),
              predict(c, bare, three, Algorithm::recursive_doubling, n), 1e-12);
  // Ranks within the cores pay nothing: 8 hosts of 2 ranks on 2 cores each.
  EXPECT_NEAR(predict(c, l, Topology{8, 2}, Algorithm::ring, n), predict(c, bare, Topology{8, 2}, Algorithm::ring, n),
              1e-12);
}

TEST(Model, AWireHidesAnOversubscribedWaitBehindItsTransfer) {
  const Calibration c = example();
  Link l = c.links.at("wire");
  l.step = {{1.0, 10e-6}, {2.0, 70e-6}};  // 60 us more per step at 2 ranks per core
  const Link bare = c.links.at("wire");
  Topology shared{4, 1};
  shared.ranks_on_cores = 4;
  // 4 KiB: each step's 1 KiB takes 8 us on the wire, so the 60 us wait sets the step.
  EXPECT_NEAR(predict(c, l, shared, Algorithm::ring, 4096), 6 * (l.alpha + 60e-6), 1e-12);
  EXPECT_NEAR(predict(c, l, shared, Algorithm::recursive_doubling, 4096), 2 * (l.alpha + 60e-6 + 4096 * c.gamma * 2),
              1e-12);
  // 64 MiB: the transfers outlast the waits, which cost nothing.
  const double n = 64 << 20;
  EXPECT_NEAR(predict(c, l, shared, Algorithm::ring, n), predict(c, bare, shared, Algorithm::ring, n), 1e-12);
}

TEST(Model, SharedMemoryCopiesStretchAsMeasured) {
  SharedMemoryCost shm;
  EXPECT_DOUBLE_EQ(copy_stretch(shm, 0.5), 1);
  EXPECT_DOUBLE_EQ(copy_stretch(shm, 2), 2);  // nothing measured: the cores shared evenly
  shm.step = {{1.0, 1e-6}, {2.0, 5e-6}};
  shm.copy = {{1.0, 12e-6}, {2.0, 40e-6}};  // without the two rendezvous: 10 us, then 30 us
  EXPECT_DOUBLE_EQ(copy_stretch(shm, 1), 1);
  EXPECT_NEAR(copy_stretch(shm, 2), 3, 1e-12);
  EXPECT_NEAR(copy_stretch(shm, 1.5), 2, 1e-12);
  EXPECT_NEAR(copy_stretch(shm, 4), 7, 1e-12);  // in proportion to rho - 1
  // The stretch multiplies the bytes' time only.
  Calibration c = example();
  c.shm.copy = shm.copy;
  c.shm.step = shm.step;
  const double n = 64 << 20;
  EXPECT_NEAR(predict(c, Link{}, Topology{1, 4}, Algorithm::shared_memory, n),
              2 * c.shm.alpha + 3 * (3.0 * n * 0.2e-9) + 2 * 4e-6, 1e-12);
}

TEST(Model, CpuBoundLinksStretchByTheCoresTheirRanksUse) {
  const Calibration c = example();
  Link l = c.links.at("cpu");
  l.cpu_share = 0.5;  // each rank keeps half a core busy
  Topology three{3, 1}, four{4, 1};
  three.ranks_on_cores = 3, four.ranks_on_cores = 4;
  Link whole = l;
  whole.cpu_share = 0;
  const double n = 64 << 20;
  // 4 ranks want 2 cores of 2: no stretch; a whole core each: twice.
  const double fits = predict(c, l, four, Algorithm::ring, n), over = predict(c, whole, four, Algorithm::ring, n);
  const double wire = 2.0 * 3 / 4 * n * l.beta;
  EXPECT_NEAR(over - fits, wire, wire * 1e-9);
  EXPECT_NEAR(predict(c, l, three, Algorithm::ring, n), 4 * l.alpha + 2.0 / 3 * n * (2 * l.beta + c.gamma * 1.5), 1e-9);
}

TEST(Model, CpuBoundLinksStretchAsMeasuredPastTheCores) {
  const Calibration c = example();
  Link l = c.links.at("cpu");
  l.cpu_share = 1.0;
  l.stretch = {{1.5, 2.0}, {2.0, 2.5}};  // uneven sharing: worse than 1.5 and 2
  Topology three{3, 1}, four{4, 1}, six{6, 1};
  three.ranks_on_cores = 3, four.ranks_on_cores = 4, six.ranks_on_cores = 6;
  const double n = 64 << 20;
  EXPECT_NEAR(predict(c, l, three, Algorithm::ring, n), 4 * l.alpha + 2.0 / 3 * n * (2 * 2.0 * l.beta + c.gamma * 1.5),
              1e-9);
  EXPECT_NEAR(predict(c, l, four, Algorithm::ring, n), 6 * l.alpha + 3.0 / 4 * n * (2 * 2.5 * l.beta + c.gamma * 2),
              1e-9);
  // Beyond the last entry: in proportion to rho - 1 (3 per core: twice the stretch added at 2).
  EXPECT_NEAR(predict(c, l, six, Algorithm::ring, n), 10 * l.alpha + 5.0 / 6 * n * (2 * 4.0 * l.beta + c.gamma * 3),
              1e-9);
}

TEST(Model, SharedMemoryInterpolatesPerSize) {
  const Calibration c = example();
  EXPECT_DOUBLE_EQ(c.shm.traffic_at(1), 5.0);
  EXPECT_DOUBLE_EQ(c.shm.traffic_at(1e12), 3.0);
  EXPECT_NEAR(c.shm.traffic_at(std::sqrt(4096.0 * (64 << 20))), 4.0, 1e-9);  // halfway in log size
  const Topology two{1, 2};
  const double n = 64 << 20;
  EXPECT_NEAR(predict(c, Link{}, two, Algorithm::shared_memory, n), c.shm.alpha + 3.0 * n * 0.2e-9, 1e-12);
  Topology four{1, 4};
  EXPECT_NEAR(predict(c, Link{}, four, Algorithm::shared_memory, n), 2 * (c.shm.alpha + 3.0 * n * 0.2e-9), 1e-12);
  EXPECT_THROW(predict(c, Link{}, two, Algorithm::hierarchical, n), InvalidArgument);
}

TEST(Model, LinkBetaPerMessageSize) {
  const Calibration c = example();
  Link l = c.links.at("wire");
  EXPECT_DOUBLE_EQ(l.beta_at(4096), l.beta);  // nothing per size: beta everywhere
  l.beta_by_size = {{2048, 2e-9}, {131072, 8e-9}};
  EXPECT_DOUBLE_EQ(l.beta_at(1024), 2e-9);  // flat beyond the ends
  EXPECT_DOUBLE_EQ(l.beta_at(1 << 20), 8e-9);
  EXPECT_NEAR(l.beta_at(16384), 5e-9, 1e-18);  // halfway in log size
  // 2 ranks: the ring's steps move N/2 from each rank, recursive doubling's exchange N.
  const Topology two{2, 1};
  EXPECT_NEAR(predict(c, l, two, Algorithm::ring, 32768), 2 * l.alpha + 16384 * 2 * 5e-9, 1e-15);
  EXPECT_NEAR(predict(c, l, two, Algorithm::recursive_doubling, 16384), l.alpha + 16384 * (5e-9 + c.gamma), 1e-15);
  // Hierarchical on a wire: the L chunks of a step travel the NIC together, as one message of N/H.
  const Topology two_by_two{2, 2};
  const double n = 65536;
  Link flat = l;
  flat.beta_by_size.clear();
  flat.beta = l.beta_at(n / 2);
  EXPECT_NEAR(predict(c, l, two_by_two, Algorithm::hierarchical, n),
              predict(c, flat, two_by_two, Algorithm::hierarchical, n), 1e-15);
}

TEST(Model, OldCalibrationWithOneLinkBetaLoads) {
  // Written before links had a beta per size: that beta holds at every size.
  const std::string path = ::testing::TempDir() + "tandem_model_old.json";
  std::ofstream(path) << R"({"cores": 2, "gamma_s_per_byte": 1e-10,
    "links": {"veth": {"alpha_s": 1.2e-05, "beta_s_per_byte": 6.6e-10, "cpu_bound": true, "cpu_share": 1.0,
                       "step_s": {"1": 1.2e-05, "2": 5.1e-05}}}})";
  const Calibration c = load_calibration(path);
  const Link& l = link_named(c, "veth");
  EXPECT_TRUE(l.beta_by_size.empty());
  EXPECT_DOUBLE_EQ(l.beta_at(4096), 6.6e-10);
  EXPECT_DOUBLE_EQ(l.beta_at(64 << 20), 6.6e-10);
  const Link single{1.2e-05, 6.6e-10, true, {{1, 1.2e-05}, {2, 5.1e-05}}, 1.0, {}, {}};
  for (double n : {4096.0, 1048576.0}) {
    EXPECT_DOUBLE_EQ(predict(c, l, Topology{2, 1}, Algorithm::ring, n),
                     predict(c, single, Topology{2, 1}, Algorithm::ring, n));
  }
  std::remove(path.c_str());
}

TEST(Model, FitRecoversALine) {
  std::vector<double> x, y;
  for (double b = 4096; b <= (64 << 20); b *= 4) x.push_back(b), y.push_back(25e-6 + b * 3e-9);
  const LineFit f = fit_line(x, y);
  EXPECT_NEAR(f.a, 25e-6, 1e-9);
  EXPECT_NEAR(f.b, 3e-9, 1e-13);
}

TEST(Model, BandwidthFitIgnoresABurst) {
  // A 1 Gbit/s tbf link with a burst: 16 KiB goes through at once.
  const std::vector<double> x = {4096, 16384, 65536, 1 << 20, 16 << 20, 64 << 20};
  std::vector<double> y;
  for (double b : x) y.push_back(50e-6 + (b == 16384 ? 0 : b * 8e-9));
  const LineFit f = fit_bandwidth(x, y, 1 << 20);
  EXPECT_NEAR(f.b, 8e-9, 1e-12);
  EXPECT_NEAR(f.a, 50e-6, 1e-9);
}

TEST(Model, CalibrationFileRoundTrip) {
  const std::string path = ::testing::TempDir() + "tandem_model_roundtrip.json";
  Calibration saved = example();
  saved.shm.step = {{1.0, 1e-6}, {1.5, 3e-6}};
  saved.links["wire"].step = {{1.0, 10e-6}, {2.0, 70e-6}};
  saved.links["wire"].beta_by_size = {{2048, 2e-9}, {33554432, 8e-9}};
  saved.links["cpu"].stretch = {{1.5, 2.1}};
  saved.samples["cpu 1.5 stretch"] = {2.0, 2.1, 2.3};
  save_calibration(saved, path);
  const Calibration c = load_calibration(path);
  EXPECT_EQ(c.cores, 2);
  EXPECT_DOUBLE_EQ(c.gamma, 0.1e-9);
  EXPECT_DOUBLE_EQ(c.shm.beta_at(64 << 20), 0.2e-9);
  EXPECT_DOUBLE_EQ(link_named(c, "wire").beta, 8e-9);
  EXPECT_TRUE(link_named(c, "cpu").cpu_bound);
  EXPECT_DOUBLE_EQ(c.shm.step.at(1.5), 3e-6);
  EXPECT_DOUBLE_EQ(link_named(c, "wire").step.at(2.0), 70e-6);
  EXPECT_EQ(link_named(c, "wire").beta_by_size, saved.links["wire"].beta_by_size);
  EXPECT_TRUE(link_named(c, "cpu").beta_by_size.empty());
  EXPECT_DOUBLE_EQ(link_named(c, "cpu").stretch.at(1.5), 2.1);
  EXPECT_EQ(c.samples.at("cpu 1.5 stretch"), saved.samples["cpu 1.5 stretch"]);
  try {
    link_named(c, "ib");
    FAIL() << "an unknown link must throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("known: cpu, wire"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

TEST(Model, ParsesCasesAndHypotheticalLinks) {
  const ValidateCase v = parse_case("2x3:veth=/tmp/a.json");
  EXPECT_EQ(v.topology.hosts, 2);
  EXPECT_EQ(v.topology.ranks_per_host, 3);
  EXPECT_EQ(v.link, "veth");
  EXPECT_EQ(v.file, "/tmp/a.json");
  EXPECT_EQ(parse_case("1x4=shm.json").link, "");
  EXPECT_THROW(parse_case("2x2=f.json"), InvalidArgument);  // two hosts need a link
  EXPECT_THROW(parse_case("banana"), InvalidArgument);
  const Link l = parse_hypothetical_link("100:5");
  EXPECT_DOUBLE_EQ(l.alpha, 5e-6);
  EXPECT_DOUBLE_EQ(l.beta, 8.0 / 100e9);
  EXPECT_THROW(parse_hypothetical_link("fast"), InvalidArgument);
  EXPECT_THROW(parse_hypothetical_link("100x:5"), InvalidArgument);
}

// Calibrate on 2 real ranks, then predict and validate against a sweep measured here.
TEST(Model, CalibratePredictValidateEndToEnd) {
  const std::string tandem = testing::env("TANDEM_BIN");
  if (tandem.empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  const std::string dir = ::testing::TempDir();
  const std::string cal = dir + "tandem_model_e2e.json", sweep = dir + "tandem_model_e2e_sweep.json";
  std::remove(cal.c_str());
  auto r = testing::run(
      tandem + " launch -n 2 --timeout 120 -- " + tandem + " model calibrate -o " + cal + " --sizes 4K,64K,1M -n 3",
      150);
  ASSERT_EQ(r.status, 0) << r.text;
  const Calibration c = load_calibration(cal);
  EXPECT_GT(c.gamma, 0);
  EXPECT_EQ(c.shm.beta.size(), 3u);
  for (const auto& [bytes, traffic] : c.shm.traffic) EXPECT_GT(traffic, 1.0) << bytes;
  EXPECT_EQ(c.shm.step.size(), 1u);  // the 2-rank step and 1 MiB allgather
  EXPECT_EQ(c.shm.copy.size(), 1u);
  // The step alone at another rank count adds an entry and keeps the rest.
  r = testing::run(tandem + " launch -n 3 --timeout 120 -- " + tandem + " model calibrate -o " + cal + " --step-only",
                   150);
  ASSERT_EQ(r.status, 0) << r.text;
  const Calibration stepped = load_calibration(cal);
  EXPECT_EQ(stepped.shm.step.size(), 2u) << r.text;
  EXPECT_EQ(stepped.shm.copy.size(), 2u) << r.text;
  EXPECT_EQ(stepped.shm.beta, c.shm.beta);
  r = testing::run(
      tandem + " launch -n 2 --timeout 120 -- " + tandem + " model calibrate -o " + cal + " --step-only --link nowhere",
      150);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.text.find("no link 'nowhere'"), std::string::npos) << r.text;

  r = testing::run(tandem + " model predict -c " + cal + " --link 100:5 -t 8x8 -t 64x8 --sizes 1M,256M", 30);
  ASSERT_NE(r.text.find("hierarchical"), std::string::npos) << r.text;
  ASSERT_NE(r.text.find("64 host(s) x 8 rank(s)"), std::string::npos) << r.text;

  r = testing::run(tandem + " launch -n 2 --timeout 120 -- " + tandem +
                       " bench allreduce -b 4K -e 1M -f 16 -n 3 -w 1 -c 0 --format json > " + sweep,
                   150);
  ASSERT_EQ(r.status, 0) << r.text;
  r = testing::run(tandem + " model validate -c " + cal + " --case 1x2=" + sweep, 30);
  ASSERT_EQ(r.status, 0) << r.text;
  EXPECT_NE(r.text.find("configurations"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("1x2 shm"), std::string::npos) << r.text;

  r = testing::run(tandem + " model validate -c " + cal + " --case 1x3=" + sweep + "", 30);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.text.find("has 2 ranks but its case says 3"), std::string::npos) << r.text;
  std::remove(cal.c_str());
  std::remove(sweep.c_str());
}

}  // namespace
}  // namespace tandem::bench
