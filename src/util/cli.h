// The command line of Zeppelin's programs (zprun, zptopo, zpplan, the
// benchmarks): CLI11 (header-only, Debian libcli11-dev), with what they share.
//
//  - Values are read by the parsers of strings.h as soon as CLI11 meets them
//    (addValue), so the first bad option on the line is the one reported and
//    each program words its own messages (UsageError).
//  - CLI11's own errors come out in the same words: "-n needs a value",
//    "--prefix takes no value".
//  - -h / --help acts where it stands, as with getopt: the options after it
//    are not read (an unknown one before it is still an error, as it would
//    be had the program read its arguments one by one).
//  - Arguments the program does not know are set aside (extras()), for the
//    program to say so in its words or, with CLI11's prefix_command, to take
//    as the command it runs.
//  - Help reads as a Unix tool's: the usage lines, the description, the
//    options by group ("-n, --np N"), then the notes (CLI11's footer).
//
// Depends on nothing of Zeppelin's but strings.h; the library does not use it.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#pragma once

#include <CLI/CLI.hpp>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace zp::cli {

constexpr int kExitUsage = 2;  // every program's exit code for a bad command line

// A bad command line; what() is the whole message, printed after "<program>: ".
class UsageError : public CLI::ParseError {
 public:
  explicit UsageError(std::string message) : CLI::ParseError("UsageError", std::move(message), kExitUsage) {}
};

// An option the program does not have; what() is "unknown option <option>".
class UnknownOption : public UsageError {
 public:
  explicit UnknownOption(std::string opt) : UsageError("unknown option " + opt), option(std::move(opt)) {}
  std::string option;  // as it was given
};

// The help's layout (see above).
class HelpFormatter : public CLI::Formatter {
 public:
  explicit HelpFormatter(std::string usage) : usage_(std::move(usage)) {}
  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override;
  std::string make_option_name(const CLI::Option* opt, bool positional) const override;

 private:
  std::string groups(const CLI::App* app) const;
  std::string usage_;  // "usage: prog ...", one or more lines
};

// Sets app up for a Zeppelin program: the help's layout with these usage
// lines, descriptions starting at column `column`, -h / --help, extras set
// aside.
void configure(CLI::App& app, const std::string& usage, size_t column);

// An option taking one value: `take` reads it (throwing UsageError if it is
// bad) as soon as CLI11 meets it. valueName names the value in the help.
CLI::Option* addValue(CLI::App& app, const std::string& names, const std::string& valueName,
                      const std::string& help, std::function<void(const std::string&)> take);

// A flag (no value: "--flag=x" is an error).
CLI::Option* addFlag(CLI::App& app, const std::string& names, bool* out, const std::string& help);

// Parses args (the arguments, without the program's name). Throws
// CLI::CallForHelp for -h / --help (UnknownOption if one came before it),
// UsageError for a bad command line, and whatever an option's `take` throws;
// then, if unread is given, *unread is the number of trailing arguments that
// were not read.
void parse(CLI::App& app, const std::vector<std::string>& args, size_t* unread = nullptr);

// What parse() set aside, in order: arguments it does not know, and with
// prefix_command the command from the first argument that is not an option.
// Without the "--" that ends the options, if that came first.
std::vector<std::string> extras(const CLI::App& app);

// The whole parse of a program that takes options and no arguments (zptopo,
// zpplan): true to go on; false with *exitCode set after -h (the help on
// stdout, 0) or a bad command line ("<program>: <what>" on stderr, 2). An
// argument it does not know is worded with unknownFormat ("unknown option
// '%s'") and followed by the help.
bool parseOptionsOnly(CLI::App& app, int argc, char** argv, const char* unknownFormat, int* exitCode);

// Whether arg has an option's form ("-x", "--x", but not "-" or "--").
bool isOption(const std::string& arg);

// Throws UnknownOption for the first of extras() that has an option's form
// (with prefix_command, only if it comes before the command).
void rejectUnknownOptions(const CLI::App& app);

}  // namespace zp::cli
