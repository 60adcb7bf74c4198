// Every settings table, row by row: a value set in a fake environment lands in
// its layer's options, every row is documented (docs/configuration.md agrees
// with the tables), printed by `tandem info --settings`, and a bad value is an
// InvalidArgument naming the variable.
#include "tandem/settings.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "../trainer/trainer_settings.h"
#include "fake_env.h"
#include "settings_info.h"
#include "tandem/bootstrap.h"
#include "tandem/errors.h"
#include "tandem/launch/launch.h"
#include "tandem/logging.h"
#include "tandem/paramserver.h"
#include "tandem/ring/ring.h"

namespace tandem {
namespace {

// Text settings with a syntax of their own, each with a well-formed value.
const std::map<std::string, std::string> kStructuredText = {{"TANDEM_SHM_PATHS", "alltoall:heap:1M-=cma"},
                                                            {"TANDEM_LOG_LEVEL", "info,liveness=debug"},
                                                            {"SPDLOG_LEVEL", "warn,mine=trace"}};

// A good value of `s` other than its default, and how the options show it.
std::pair<std::string, std::string> sample(const Setting& s) {
  if (s.foreign) return {"x", "set (left to UCX)"};
  switch (s.kind) {
    case SettingKind::boolean: {
      const std::string v = s.default_value == "1" ? "0" : "1";
      return {v, v};
    }
    case SettingKind::choice:
      for (const auto& a : s.accepted)
        if (a != s.default_value) return {a, a};
      return {"", ""};
    case SettingKind::text: {
      const auto it = kStructuredText.find(s.variable);
      const std::string v = it == kStructuredText.end() ? "eth9" : it->second;
      return {v, v};
    }
    default: {
      const std::string v = std::to_string(std::clamp(12288LL, s.min, s.max));
      return {v, v};
    }
  }
}

// Runs `check(row)` for every row of every table, each with its options type.
template <class Options>
void each_row(const SettingTable<Options>& table, const std::function<void(const SettingField<Options>&)>& check) {
  for (const auto& f : table) {
    SCOPED_TRACE(f.setting.variable);
    check(f);
  }
}

template <class Options>
void expect_rows_read(const SettingTable<Options>& table) {
  each_row<Options>(table, [](const SettingField<Options>& f) {
    const auto [value, shown] = sample(f.setting);
    Options o;
    read_settings(std::vector<SettingField<Options>>{f}, lookup({{f.setting.variable, value}}), o);
    EXPECT_EQ(f.show(o), shown);
  });
}

template <class Options>
void expect_bad_values_named(const SettingTable<Options>& table) {
  each_row<Options>(table, [](const SettingField<Options>& f) {
    const Setting& s = f.setting;
    if (s.kind == SettingKind::text || s.foreign) return;
    std::vector<std::string> bad = {"x1", "-1", ""};
    if (s.max < 1000000) bad.push_back(std::to_string(s.max + 1));
    if (s.min > 0 && s.kind != SettingKind::boolean && s.kind != SettingKind::choice)
      bad.push_back(std::to_string(s.min - 1));
    for (const auto& v : bad) {
      Options o;
      try {
        read_settings(std::vector<SettingField<Options>>{f}, lookup({{s.variable, v}}), o);
        ADD_FAILURE() << "accepted " << s.variable << "='" << v << "'";
      } catch (const InvalidArgument& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(s.variable + "='" + v + "'"), std::string::npos) << what;
      }
    }
  });
}

TEST(Settings, EveryRowIsReadIntoItsOptions) {
  for (const auto* t : {&comm_settings(), &netif_settings(), &transport_settings(), &reduce_settings()})
    expect_rows_read(*t);
  expect_rows_read(ring::ring_settings());
  expect_rows_read(ps::settings());
  expect_rows_read(trainer::trainer_settings());
  expect_rows_read(launch::launch_settings());
  expect_rows_read(log_settings());
}

TEST(Settings, EveryRowIsReadByItsLayersReader) {
  const Env job = {{"TANDEM_RANK", "0"}, {"TANDEM_WORLD_SIZE", "2"}, {"TANDEM_STORE_ADDR", "127.0.0.1:29500"}};
  for (const auto* t : {&comm_settings(), &netif_settings(), &transport_settings(), &reduce_settings()}) {
    each_row<CommOptions>(*t, [&](const SettingField<CommOptions>& f) {
      const auto [value, shown] = sample(f.setting);
      Env env = job;
      env[f.setting.variable] = value;
      EXPECT_EQ(f.show(comm_options_from_env(lookup(env))), shown);
      EXPECT_EQ(f.show(tuning_from_env(lookup(env))), f.setting.variable == "TANDEM_HOST_STORE" ? "0" : shown);
    });
  }
  each_row<ring::RingOptions>(ring::ring_settings(), [](const SettingField<ring::RingOptions>& f) {
    const auto [value, shown] = sample(f.setting);
    EXPECT_EQ(f.show(ring::ring_options_from_env(lookup({{f.setting.variable, value}}))), shown);
  });
  each_row<ps::Options>(ps::settings(), [](const SettingField<ps::Options>& f) {
    const auto [value, shown] = sample(f.setting);
    EXPECT_EQ(f.show(ps::ps_options_from_env(lookup({{f.setting.variable, value}}))), shown);
  });
  // And `tandem info --settings` reports each as coming from the environment.
  for (const Setting& s : cli::all_settings()) {
    SCOPED_TRACE(s.variable);
    const auto [value, shown] = sample(s);
    bool found = false;
    for (const SettingValue& v : cli::all_setting_values(lookup({{s.variable, value}}))) {
      if (v.setting.variable != s.variable || v.setting.layer != s.layer) continue;
      found = true;
      EXPECT_EQ(v.value, shown);
      EXPECT_EQ(v.source, SettingSource::environment);
    }
    EXPECT_TRUE(found);
  }
}

TEST(Settings, DefaultsAreTheDocumentedOnes) {
  for (const SettingValue& v : cli::all_setting_values(lookup({}))) {
    SCOPED_TRACE(v.setting.variable);
    EXPECT_EQ(v.source, SettingSource::default_value);
    EXPECT_EQ(v.value, v.setting.foreign ? "unset" : v.setting.default_value);
  }
}

TEST(Settings, BadValuesAreErrorsNamingTheVariable) {
  for (const auto* t : {&comm_settings(), &netif_settings(), &transport_settings(), &reduce_settings()})
    expect_bad_values_named(*t);
  expect_bad_values_named(ring::ring_settings());
  expect_bad_values_named(ps::settings());
  expect_bad_values_named(trainer::trainer_settings());
  expect_bad_values_named(launch::launch_settings());
}

TEST(Settings, ByteCountsTakeSizeSuffixes) {
  auto ring_segment = [](const std::string& v) {
    return ring::ring_options_from_env(lookup({{"TANDEM_SEGMENT_BYTES", v}})).segment_bytes;
  };
  EXPECT_EQ(ring_segment("4M"), size_t(4) << 20);
  EXPECT_EQ(ring_segment("512KiB"), size_t(512) << 10);
  EXPECT_EQ(ring_segment("65536"), size_t(65536));
  for (const char* bad : {"4X", "4 K", "1.5M", "K"}) {
    try {
      ring_segment(bad);
      ADD_FAILURE() << "accepted TANDEM_SEGMENT_BYTES='" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("with K, M or G: 64M"), std::string::npos) << e.what();
    }
  }
  const Env job = {{"TANDEM_RANK", "0"},
                   {"TANDEM_WORLD_SIZE", "2"},
                   {"TANDEM_STORE_ADDR", "127.0.0.1:29500"},
                   {"TANDEM_P2P_STREAM_MAX_BYTES", "16K"}};
  EXPECT_EQ(comm_options_from_env(lookup(job)).p2p_stream_max_bytes, size_t(16) << 10);
}

TEST(Settings, SpecialChecksKeepTheirMessages) {
  auto message = [](const Env& env) -> std::string {
    try {
      tuning_from_env(lookup(env));
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_NE(message({{"TANDEM_HEARTBEAT_MS", "50"}}).find("TANDEM_HEARTBEAT_MS='50' is too short"), std::string::npos);
  EXPECT_NE(message({{"TANDEM_NETWORK_INTERFACE", "eth0"}, {"DTRAIN_NETWORK_INTERFACE", "eth1"}}).find("disagree"),
            std::string::npos);
  EXPECT_EQ(message({{"TANDEM_NETWORK_INTERFACE", "eth0"}, {"DTRAIN_NETWORK_INTERFACE", "eth0"}}), "accepted");
  EXPECT_EQ(network_interface_from_env(lookup({{"DTRAIN_NETWORK_INTERFACE", "^docker"}})), "^docker");
  EXPECT_NE(message({{"TANDEM_TIMEOUT_MS", "0"}}).find("set it to a positive number of milliseconds"),
            std::string::npos);
}

std::string log_level_error(const Env& env) {
  try {
    log_options_from_env(lookup(env));
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "accepted";
}

TEST(Settings, LogLevelsParseAsSpdlogsSyntax) {
  for (const char* good : {"debug", "WARN", "off", "info,liveness=debug", "warn, store=trace ,transport=err", ""})
    EXPECT_EQ(log_level_error({{"TANDEM_LOG_LEVEL", good}}), "accepted") << good;
  EXPECT_EQ(log_options_from_env(lookup({{"TANDEM_LOG_LEVEL", "info,netif=debug"}})).levels(), "info,netif=debug");
  // SPDLOG_LEVEL may name the program's own loggers; TANDEM_LOG_LEVEL wins when both are set.
  EXPECT_EQ(log_level_error({{"SPDLOG_LEVEL", "info,mine=debug"}}), "accepted");
  EXPECT_EQ(log_options_from_env(lookup({{"SPDLOG_LEVEL", "off"}, {"TANDEM_LOG_LEVEL", "warn"}})).levels(), "warn");
  EXPECT_EQ(log_options_from_env(lookup({{"SPDLOG_LEVEL", "off"}})).levels(), "off");
  for (const char* bad : {"verbose", "info,liveness=loud", "info,nosuch=debug", "=debug", "info,liveness"}) {
    const std::string what = log_level_error({{"TANDEM_LOG_LEVEL", bad}});
    EXPECT_NE(what.find(std::string("TANDEM_LOG_LEVEL='") + bad + "' is invalid"), std::string::npos) << what;
    EXPECT_NE(what.find("trace, debug, info, warn, error, critical or off"), std::string::npos) << what;
    EXPECT_NE(what.find("comm, engine, liveness, netif, store or transport"), std::string::npos) << what;
  }
  EXPECT_NE(log_level_error({{"SPDLOG_LEVEL", "mine=loud"}}).find("SPDLOG_LEVEL='mine=loud'"), std::string::npos);
}

TEST(Settings, EveryRowIsDocumented) {
  const std::vector<Setting> all = cli::all_settings();
  std::map<std::string, int> seen;
  for (const Setting& s : all) {
    SCOPED_TRACE(s.variable);
    EXPECT_FALSE(s.doc.empty());
    EXPECT_FALSE(s.layer.empty());
    EXPECT_FALSE(s.name.empty());
    if (s.kind == SettingKind::choice) {
      EXPECT_FALSE(s.accepted.empty());
    }
    EXPECT_EQ(++seen[s.variable], 1) << "declared twice";
  }
  std::ifstream file(std::string(TANDEM_SOURCE_DIR) + "/docs/configuration.md");
  ASSERT_TRUE(file) << "docs/configuration.md is missing";
  std::stringstream text;
  text << file.rdbuf();
  EXPECT_EQ(text.str(), settings_markdown(all))
      << "docs/configuration.md disagrees with the tables; regenerate it with "
         "`tandem info --settings --markdown > docs/configuration.md`";
}

TEST(Settings, InfoPrintsEverySetting) {
  const char* bin = std::getenv("TANDEM_BIN");
  if (!bin) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  FILE* p = ::popen((std::string("env TANDEM_SHM=0 ") + bin + " info --settings").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << out;
  for (const Setting& s : cli::all_settings()) {
    EXPECT_NE(out.find(" " + s.variable + " "), std::string::npos) << s.variable << " missing from\n" << out;
  }
  const size_t at = out.find(" TANDEM_SHM ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string line = out.substr(at, out.find('\n', at) - at);
  EXPECT_NE(line.find(" 0 "), std::string::npos) << line;
  EXPECT_NE(line.find("environment"), std::string::npos) << line;
}

}  // namespace
}  // namespace tandem
