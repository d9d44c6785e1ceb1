// tests.hpp precompiled at -O1, for the tests built at -O1 (Makefile).
#pragma once
#include "tests.hpp"
