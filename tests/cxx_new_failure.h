// What operator new does when it finds no memory, as C++17 says: each form
// calls the installed new_handler until one is gone, then the throwing
// forms throw std::bad_alloc and the nothrow forms return null, also when
// the handler throws. hakmem's new is C and reaches the C++ runtime only
// here (src/override_cxx.c): cxx_churn checks it where libstdc++ is the
// program's, test_dlopen through a module loaded with RTLD_LOCAL.
// Returns the number of failed checks, each reported on stderr.
#ifndef HAKMEM_TEST_CXX_NEW_FAILURE_H
#define HAKMEM_TEST_CXX_NEW_FAILURE_H

#include <cstddef>
#include <cstdio>
#include <new>

namespace new_failure {

static const std::size_t impossible = std::size_t(1) << 62;
static int handler_calls;

// Called once, then uninstalls itself: new goes on to its failure.
static void handler_once()
{
    handler_calls++;
    std::set_new_handler(nullptr);
}

static void handler_throws()
{
    handler_calls++;
    throw std::bad_alloc();
}

// The form `make` calls, with `handler` installed: whether it threw
// std::bad_alloc, what it returned, and how often the handler ran.
template <typename Make> static bool throws(Make make, std::new_handler handler, void **got)
{
    handler_calls = 0;
    std::set_new_handler(handler);
    *got = reinterpret_cast<void *>(1);
    bool threw = false;
    try {
        *got = make();
    } catch (const std::bad_alloc &) {
        threw = true;
    }
    std::set_new_handler(nullptr);
    return threw;
}

static int check(const char *who)
{
    int failures = 0;
    auto expect = [&](bool ok, const char *what) {
        if (!ok) {
            std::fprintf(stderr, "%s: operator new on failure: %s\n", who, what);
            failures++;
        }
    };
    void *got;
    const std::align_val_t page{4096};
    auto plain = [] { return ::operator new(impossible); };
    auto array = [] { return ::operator new[](impossible); };
    auto aligned = [&] { return ::operator new(impossible, page); };
    auto nothrow = [] { return ::operator new(impossible, std::nothrow); };
    auto nothrow_array = [] { return ::operator new[](impossible, std::nothrow); };
    auto nothrow_aligned = [&] { return ::operator new(impossible, page, std::nothrow); };

    expect(throws(plain, nullptr, &got), "new without a handler does not throw std::bad_alloc");
    expect(throws(plain, handler_once, &got) && handler_calls == 1, "new does not call the handler once, then throw");
    expect(throws(array, handler_once, &got) && handler_calls == 1, "new[] does not call the handler once, then throw");
    expect(throws(aligned, handler_once, &got) && handler_calls == 1,
           "aligned new does not call the handler once, then throw");
    expect(throws(plain, handler_throws, &got) && handler_calls == 1, "new does not pass on what the handler throws");

    expect(!throws(nothrow, nullptr, &got) && !got, "nothrow new without a handler does not return null");
    expect(!throws(nothrow, handler_once, &got) && !got && handler_calls == 1,
           "nothrow new does not call the handler once, then return null");
    expect(!throws(nothrow, handler_throws, &got) && !got && handler_calls == 1,
           "nothrow new does not return null when the handler throws");
    expect(!throws(nothrow_array, handler_throws, &got) && !got && handler_calls == 1,
           "nothrow new[] does not return null when the handler throws");
    expect(!throws(nothrow_aligned, handler_throws, &got) && !got && handler_calls == 1,
           "aligned nothrow new does not return null when the handler throws");
    return failures;
}

} // namespace new_failure

#endif
