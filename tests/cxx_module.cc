// A C++ library that test_dlopen loads with RTLD_LOCAL into a C program:
// its libstdc++ is then nowhere in the global scope, where hakmem's new
// (C, src/override_cxx.c) finds the C++ runtime in other programs.
#include <cstddef>

#include "cxx_new_failure.h"

extern "C" {

char *module_cxx_new(std::size_t n) { return new char[n]; }

void module_cxx_delete(char *p) { delete[] p; }

int module_cxx_new_failures() { return new_failure::check("cxx_module"); }
}
