// Every fuzz target in one translation unit, for the replay build of `make
// test`: the Makefile compiles this file with `-include tests/fuzz/fuzz_NAME.cpp`
// for each target, one compile instead of one per target (each pulls in the
// same large headers). The libFuzzer build compiles each target on its own.
