// The command line of Zeppelin's programs: see cli.h.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/util/cli.h"

#include <cstdio>
#include <utility>

#include "src/util/strings.h"

namespace zp::cli {
namespace {

bool endsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// CLI11's own errors in the words of Zeppelin's programs. CLI11 (2.1) says
// "NAME: 1 required TEXT missing" and "NAME was given a disallowed flag
// override"; anything else is passed on as it is. args are the arguments
// given; typedLast: CLI11 ran out of them (the option is the last one).
std::string message(const CLI::ParseError& e, const std::vector<std::string>& args, bool typedLast) {
  const std::string what = e.what();
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
    if (endsWith(what, " missing") && typedLast && !args.empty()) {
      // The option as it was typed ("-n", not CLI11's "--np").
      return args.back().substr(0, args.back().find('=')) + " needs a value";
    }
    const std::string override = " was given a disallowed flag override";
    if (endsWith(what, override)) {
      std::string name = what.substr(0, what.size() - override.size());
      return (name.size() == 1 ? "-" : "--") + name + " takes no value";
    }
  }
  return what;
}

}  // namespace

std::string HelpFormatter::make_help(const CLI::App* app, std::string, CLI::AppFormatMode) const {
  std::string out = usage_;
  if (!app->get_description().empty()) out += "\n" + app->get_description() + "\n";
  out += groups(app);
  if (!app->get_footer().empty()) out += "\n" + app->get_footer() + "\n";
  return out;
}

// One blank line before each group (CLI11's own puts two between groups).
std::string HelpFormatter::groups(const CLI::App* app) const {
  std::string out;
  for (const std::string& group : app->get_groups()) {
    std::vector<const CLI::Option*> opts = app->get_options(
        [&](const CLI::Option* opt) { return opt->get_group() == group && opt->nonpositional(); });
    if (!group.empty() && !opts.empty()) out += make_group(group, false, opts);
  }
  return out;
}

// "-n, --np", as Unix tools list them (CLI11's own: "-n,--np").
std::string HelpFormatter::make_option_name(const CLI::Option* opt, bool positional) const {
  std::string names = CLI::Formatter::make_option_name(opt, positional), out;
  for (char c : names) out += c == ',' ? std::string(", ") : std::string(1, c);
  return out;
}

void configure(CLI::App& app, const std::string& usage, size_t column) {
  auto formatter = std::make_shared<HelpFormatter>(usage);
  formatter->column_width(column);
  app.formatter(formatter);
  // Help as soon as it is met, not after the whole line is read: the options
  // after -h may be wrong or unfinished (zprun -h --nodes).
  app.set_help_flag();
  app.add_flag_callback("-h,--help", [] { throw CLI::CallForHelp(); }, "show this help")
      ->trigger_on_parse()
      ->disable_flag_override();
  app.allow_extras();
}

CLI::Option* addValue(CLI::App& app, const std::string& names, const std::string& valueName,
                      const std::string& help, std::function<void(const std::string&)> take) {
  return app.add_option_function<std::string>(names, std::move(take), help)
      ->option_text(valueName)
      ->trigger_on_parse();
}

CLI::Option* addFlag(CLI::App& app, const std::string& names, bool* out, const std::string& help) {
  return app.add_flag(names, *out, help)->disable_flag_override();
}

void parse(CLI::App& app, const std::vector<std::string>& args, size_t* unread) {
  // CLI11 reads the arguments from the back of the vector, popping each one.
  std::vector<std::string> rest(args.rbegin(), args.rend());
  struct Unread {
    const std::vector<std::string>& rest;
    size_t* out;
    ~Unread() {
      if (out != nullptr) *out = rest.size();
    }
  } report{rest, unread};
  try {
    app.parse(rest);
  } catch (const UsageError&) {
    throw;
  } catch (const CLI::Success&) {
    rejectUnknownOptions(app);
    throw;
  } catch (const CLI::ParseError& e) {
    throw UsageError(message(e, args, rest.empty()));
  }
}

bool parseOptionsOnly(CLI::App& app, int argc, char** argv, const char* unknownFormat, int* exitCode) {
  const std::string prog = app.get_name();
  try {
    parse(app, std::vector<std::string>(argv + 1, argv + argc));
    // No arguments: the first one set aside is as unknown as an option.
    std::vector<std::string> extra = extras(app);
    if (!extra.empty()) throw UnknownOption(extra[0]);
    return true;
  } catch (const CLI::CallForHelp&) {
    fputs(app.help().c_str(), stdout);
    *exitCode = 0;
  } catch (const UnknownOption& e) {
    fprintf(stderr, "%s: %s\n%s", prog.c_str(), strprintf(unknownFormat, e.option.c_str()).c_str(),
            app.help().c_str());
    *exitCode = kExitUsage;
  } catch (const UsageError& e) {
    fprintf(stderr, "%s: %s\n", prog.c_str(), e.what());
    *exitCode = kExitUsage;
  }
  return false;
}

std::vector<std::string> extras(const CLI::App& app) {
  std::vector<std::string> out = app.remaining();
  if (!out.empty() && out.front() == "--") out.erase(out.begin());
  return out;
}

bool isOption(const std::string& arg) { return arg.size() >= 2 && arg[0] == '-' && arg != "--"; }

void rejectUnknownOptions(const CLI::App& app) {
  for (const std::string& a : extras(app)) {
    if (isOption(a)) throw UnknownOption(a);
    if (app.get_prefix_command()) break;  // the command starts here: its options are its own
  }
}

}  // namespace zp::cli
