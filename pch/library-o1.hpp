// library.hpp precompiled at -O1, for the library files built at -O1 (Makefile).
#pragma once
#include "library.hpp"
