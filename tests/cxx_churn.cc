// A C++ workload: std::map and std::string churn, printing a checksum that
// must not depend on the allocator. With --check it also verifies the
// operator new family (alignment, nothrow, the new_handler, bad_alloc) and, when
// hak_owns is present (hakmem preloaded or linked), that new's memory is
// hakmem's.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "cxx_new_failure.h"

static int failures;
#define EXPECT(cond)                                                     \
    do {                                                                 \
        if (!(cond)) {                                                   \
            std::fprintf(stderr, "cxx_churn: check failed: %s\n", #cond); \
            failures++;                                                  \
        }                                                                \
    } while (0)

struct alignas(256) Wide {
    char bytes[300];
};

static void check_operators(bool (*owns)(const void *))
{
    int *one = new int(5);
    int *many = new int[1000];
    Wide *wide = new Wide;
    Wide *wides = new Wide[3];
    EXPECT(reinterpret_cast<std::uintptr_t>(wide) % 256 == 0);
    EXPECT(reinterpret_cast<std::uintptr_t>(wides) % 256 == 0);
    void *huge = ::operator new(std::size_t(1) << 62, std::nothrow);
    EXPECT(huge == nullptr);
    bool threw = false;
    try {
        void *again = ::operator new(std::size_t(1) << 62);
        ::operator delete(again);
    } catch (const std::bad_alloc &) {
        threw = true;
    }
    EXPECT(threw);
    failures += new_failure::check("cxx_churn");
    void *aligned = ::operator new(100, std::align_val_t(4096), std::nothrow);
    EXPECT(aligned && reinterpret_cast<std::uintptr_t>(aligned) % 4096 == 0);
    if (owns) {
        EXPECT(owns(one) && owns(many) && owns(wide) && owns(wides) && owns(aligned));
        std::string s(100, 'x');
        EXPECT(owns(s.data()));
    }
    ::operator delete(aligned, std::align_val_t(4096));
    delete one;
    delete[] many;
    delete wide;
    delete[] wides;
    ::operator delete(::operator new(48), std::size_t(48)); // sized delete
}

int main(int argc, char **argv)
{
    bool check = argc > 1 && std::strcmp(argv[1], "--check") == 0;
    if (check) {
        auto owns = reinterpret_cast<bool (*)(const void *)>(dlsym(RTLD_DEFAULT, "hak_owns"));
        bool expect_hakmem = std::getenv("EXPECT_HAKMEM") != nullptr;
        EXPECT(!expect_hakmem || owns != nullptr);
        check_operators(owns);
    }
    std::map<std::string, std::vector<int>> table;
    std::uint64_t checksum = 0;
    std::uint32_t rng = 42;
    for (int i = 0; i < 200000; i++) {
        rng = rng * 1103515245u + 12345u;
        std::string key = "key-" + std::to_string(rng % 5000) + std::string(rng % 40, 'k');
        auto &values = table[key];
        values.push_back(static_cast<int>(rng));
        if (values.size() > 20)
            table.erase(key);
        if (i % 1000 == 0) {
            auto copy = std::make_unique<std::map<std::string, std::vector<int>>>(table);
            checksum += copy->size();
        }
    }
    for (const auto &entry : table)
        for (int v : entry.second)
            checksum = checksum * 31 + static_cast<std::uint32_t>(v) + entry.first.size();
    std::printf("entries %zu checksum %llu\n", table.size(), static_cast<unsigned long long>(checksum));
    return failures ? 1 : 0;
}
