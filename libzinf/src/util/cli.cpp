#include <zinf/cli.hpp>

#include <cstdio>
#include <exception>

namespace zinf::cli {

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
    } catch (const std::exception& e) {
        mark_failing();
        std::lock_guard lk(log::stderr_mutex());
        std::fprintf(stderr, "%s: internal error: %s\n", program.c_str(), e.what());
        return exit_code::internal;
    }
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
