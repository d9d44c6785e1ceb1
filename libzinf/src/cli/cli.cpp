#include <zinf/cli.hpp>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cctype>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>

namespace zinf::cli {

namespace {

// CLI11 converts an unsigned option with strtoull, which takes "-1" and
// wraps it to 2^64-1 (--steps -1 would train for ever); a floating-point one
// with strtod, which takes "nan" and "inf" (--min-read-gibps nan compares
// false with everything, so it never fires). No option means either: every
// unsigned and floating-point option of every program refuses them here,
// before the conversion.
// It saturates a number past 2^64-1 to 2^64-1 as well (--seed
// 18446744073709551616 was taken as 18446744073709551615): refused, read as
// strtoull reads it (base 0: decimal, 0x hexadecimal, 0 octal).
std::string refuse_negative(std::string& text) {
    const auto first = text.find_first_not_of(" \t");
    if (first != std::string::npos && text[first] == '-')
        return "'" + text + "' is negative; this option takes a count or size of 0 or more";
    if (first == std::string::npos) return {};
    std::string_view digits = std::string_view(text).substr(first);
    if (digits.starts_with('+')) digits.remove_prefix(1);
    int base = 10;
    if (digits.starts_with("0x") || digits.starts_with("0X")) {
        base = 16;
        digits.remove_prefix(2);
    } else if (digits.size() > 1 && digits.front() == '0') {
        base = 8;
    }
    std::uint64_t v = 0;
    if (std::from_chars(digits.data(), digits.data() + digits.size(), v, base).ec == std::errc::result_out_of_range)
        return "'" + text + "' is more than " + std::to_string(UINT64_MAX) + ", the largest number this option takes";
    return {};
}

std::string refuse_not_finite(std::string& text) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (end != text.c_str() && !std::isfinite(v)) return "'" + text + "' is not a finite number";
    return {};
}

void guard_numbers(CLI::App& app) {
    for (CLI::Option* opt : app.get_options()) {
        const std::string type = opt->get_type_name();
        if (type.rfind("UINT", 0) == 0) opt->check(CLI::Validator(refuse_negative, "", "NONNEGATIVE"));
        else if (type.rfind("FLOAT", 0) == 0) opt->check(CLI::Validator(refuse_not_finite, "", "FINITE"));
    }
    for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) guard_numbers(*sub);
}

}  // namespace

void add_common(CLI::App& app, Common& common) {
    app.add_flag("-q,--quiet", common.quiet, "Print nothing on stderr but errors");
    app.add_flag("-v,--verbose", common.verbose, "Say more on stderr: debug detail");
    app.set_version_flag("--version", std::string(version()));
    app.option_defaults()->always_capture_default();
}

int run(CLI::App& app, int argc, char** argv, const std::string& program, const Common& common,
        const std::function<int()>& body) {
    log::set_program(program);
    try {
        guard_numbers(app);
        app.parse(argc, argv);
    } catch (const CLI::Success& e) {
        // --help and --version: CLI11 prints them to stdout and we exit 0.
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::fprintf(stderr, "%s: %s\n%s: run '%s --help' for the options\n", program.c_str(),
                     e.what(), program.c_str(), program.c_str());
        return exit_code::usage;
    }
    log::set_level(common.quiet         ? LogLevel::quiet
                   : common.verbose > 0 ? LogLevel::debug
                                        : LogLevel::info);
    try {
        return body();
    } catch (const Error& e) {
        mark_failing();
        std::lock_guard lk(log::stderr_mutex());
        std::fprintf(stderr, "%s: %s%s\n", program.c_str(),
                     e.exit_code() == exit_code::internal ? "internal error: " : "", e.what());
        // Options used wrongly point at --help; a job too large for the
        // budget it was given (exit 64 as well) has said what to change.
        if (dynamic_cast<const UsageError*>(&e))
            std::fprintf(stderr, "%s: run '%s --help' for the options\n", program.c_str(),
                         program.c_str());
        return e.exit_code();
    } catch (const std::bad_alloc&) {
        // Not a bug in zinf: the job asked for more memory than the machine
        // gives this process. Like a job too large for its budget, a usage
        // error (zinf(7)): make it smaller or run it where there is more.
        mark_failing();
        std::lock_guard lk(log::stderr_mutex());
        std::fprintf(stderr,
                     "%s: out of memory: this job needs more memory than the machine gives it "
                     "(peak resident %s); make it smaller or run it with more memory\n",
                     program.c_str(), format_size(peak_resident_bytes()).c_str());
        return exit_code::usage;
    } catch (const std::exception& e) {
        mark_failing();
        std::lock_guard lk(log::stderr_mutex());
        std::fprintf(stderr, "%s: internal error: %s\n", program.c_str(), e.what());
        return exit_code::internal;
    }
}

CLI::Validator non_negative() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            double v = 0;
            if (!CLI::detail::lexical_cast(text, v)) return "'" + text + "' is not a number";
            return v < 0 ? "'" + text + "' is negative: it must be 0 or more" : std::string();
        },
        "NONNEGATIVE");
}

std::vector<std::uint64_t> parse_sizes(const std::vector<std::string>& items, const std::string& option) {
    std::vector<std::uint64_t> out;
    for (const auto& s : items) {
        try {
            out.push_back(parse_size(s));
        } catch (const UsageError& e) {
            throw UsageError(option + ": " + e.message());
        }
    }
    return out;
}

}  // namespace zinf::cli
