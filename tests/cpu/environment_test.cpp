// The environment: one parser for every boolean variable (1/0 true/false yes/no on/off, any case;
// anything else an error naming the variable and the accepted values), strict choices, and the
// runtime options that report a malformed variable instead of guessing.
#include "api/runtime.hpp"
#include "runtime/environment.hpp"
#include "runtime/errors.hpp"
#include "support/test_support.hpp"

#include <cstdlib>

namespace exactjit {
namespace {

// Sets a variable for one test and restores it after.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedVariable() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(Environment, BooleansAcceptEverySpellingInAnyCase) {
  for (const char* yes : {"1", "true", "TRUE", "yes", "Yes", "on", "ON"}) EXPECT_EQ(parse_boolean(yes), true) << yes;
  for (const char* no : {"0", "false", "False", "no", "NO", "off", "Off"}) EXPECT_EQ(parse_boolean(no), false) << no;
  for (const char* neither : {"", "2", "y", "enable", "true ", "offline"})
    EXPECT_EQ(parse_boolean(neither), std::nullopt) << neither;
}

TEST(Environment, EveryBooleanVariableIsParsedTheSameWay) {
  for (const EnvironmentVariable& variable : environment_variables()) {
    if (variable.kind != EnvKind::Boolean) continue;
    const std::string name(variable.name);
    {
      ScopedVariable set(name.c_str(), "false");
      EXPECT_EQ(test::expect_value(environment_boolean(name, true)), false) << name;
    }
    {
      ScopedVariable set(name.c_str(), "On");
      EXPECT_EQ(test::expect_value(environment_boolean(name)), true) << name;
    }
    {
      ScopedVariable set(name.c_str(), "");
      EXPECT_EQ(test::expect_value(environment_boolean(name, true)), true) << name;  // empty: the default
    }
    ScopedVariable set(name.c_str(), "maybe");
    auto parsed = environment_boolean(name);
    ASSERT_FALSE(static_cast<bool>(parsed)) << name;
    const ErrorReport report = take_error(parsed.takeError());
    EXPECT_EQ(report.code, ErrorCode::InvalidArgument);
    EXPECT_EQ(report.message, name + "='maybe' is not valid: use 1/0, true/false, yes/no, on/off");
    llvm::Error checked = check_environment();
    EXPECT_TRUE(static_cast<bool>(checked)) << name;
    llvm::consumeError(std::move(checked));
  }
}

TEST(Environment, ChoicesAreStrict) {
  {
    ScopedVariable set("EXACTJIT_CACHE_LAYER_CHECK", "REFUSE");
    EXPECT_EQ(test::expect_value(cache_config_from_environment()).layer_check, CacheConfig::LayerCheck::Refuse);
  }
  ScopedVariable set("EXACTJIT_CACHE_LAYER_CHECK", "loud");
  auto config = cache_config_from_environment();
  ASSERT_FALSE(static_cast<bool>(config));
  EXPECT_EQ(take_error(config.takeError()).message,
            "EXACTJIT_CACHE_LAYER_CHECK='loud' is not valid: use one of warn|refuse|off");
}

// EXACTJIT_CHECK_AFTER_LAUNCH=false used to turn checking on (anything but "0" did).
TEST(Environment, RuntimeOptionsReadBooleansWithTheSharedParser) {
  {
    ScopedVariable check("EXACTJIT_CHECK_AFTER_LAUNCH", "false");
    ScopedVariable offline("EXACTJIT_OFFLINE", "yes");
    const RuntimeOptions options = RuntimeOptions::from_environment();
    EXPECT_TRUE(options.environment_error.empty()) << options.environment_error;
    EXPECT_FALSE(options.check_after_launch);
    EXPECT_TRUE(options.offline);
  }
  {
    ScopedVariable record("EXACTJIT_RECORD_MANIFEST", "/tmp/used.specs");
    EXPECT_EQ(RuntimeOptions::from_environment().record_manifest, "/tmp/used.specs");
  }
  ScopedVariable check("EXACTJIT_CHECK_AFTER_LAUNCH", "sometimes");
  const RuntimeOptions options = RuntimeOptions::from_environment();
  EXPECT_EQ(options.environment_error,
            "EXACTJIT_CHECK_AFTER_LAUNCH='sometimes' is not valid: use 1/0, true/false, yes/no, on/off");
}

}  // namespace
}  // namespace exactjit
