// Subcommands of the `normjit` command line. Each receives argv starting at the subcommand name
// (argv[0] is e.g. "cache") and returns the process exit status.
#pragma once

int run_cache_command(int argc, char** argv);    // show / verify / clear the disk cache
int run_explain_command(int argc, char** argv);  // what normjit would do for a shape
int run_warmup_command(int argc, char** argv);   // compile ahead of time
int run_stats_command(int argc, char** argv);    // cache counters
