// C++ operator new and delete on hakmem, every variant of C++17: plain,
// array, nothrow, sized and aligned. new retries through the installed
// new_handler and throws std::bad_alloc as the standard requires. Not
// defined when the build says HAKMEM_OVERRIDE=OFF.
#ifdef HAKMEM_OVERRIDE
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <new>

extern "C" {
void *hak_cxx_alloc(std::size_t size, std::uintptr_t site);
void *hak_cxx_alloc_aligned(std::size_t align, std::size_t size, std::uintptr_t site);
void hak_cxx_free(void *p);
}

#define HAK_EXPORT __attribute__((visibility("default")))
// The call site hakmem profiles is the caller of operator new.
#define SITE reinterpret_cast<std::uintptr_t>(__builtin_return_address(0))

namespace {

void *new_or_throw(std::size_t size, std::size_t align, std::uintptr_t site)
{
    for (;;) {
        void *p = align ? hak_cxx_alloc_aligned(align, size, site) : hak_cxx_alloc(size, site);
        if (p)
            return p;
        std::new_handler handler = std::get_new_handler();
        if (!handler)
            throw std::bad_alloc();
        handler();
    }
}

void *new_or_null(std::size_t size, std::size_t align, std::uintptr_t site) noexcept
{
    try {
        return new_or_throw(size, align, site);
    } catch (...) {
        return nullptr;
    }
}

} // namespace

HAK_EXPORT void *operator new(std::size_t n) { return new_or_throw(n, 0, SITE); }
HAK_EXPORT void *operator new[](std::size_t n) { return new_or_throw(n, 0, SITE); }
HAK_EXPORT void *operator new(std::size_t n, const std::nothrow_t &) noexcept { return new_or_null(n, 0, SITE); }
HAK_EXPORT void *operator new[](std::size_t n, const std::nothrow_t &) noexcept { return new_or_null(n, 0, SITE); }
HAK_EXPORT void *operator new(std::size_t n, std::align_val_t a) { return new_or_throw(n, static_cast<std::size_t>(a), SITE); }
HAK_EXPORT void *operator new[](std::size_t n, std::align_val_t a) { return new_or_throw(n, static_cast<std::size_t>(a), SITE); }
HAK_EXPORT void *operator new(std::size_t n, std::align_val_t a, const std::nothrow_t &) noexcept
{
    return new_or_null(n, static_cast<std::size_t>(a), SITE);
}
HAK_EXPORT void *operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t &) noexcept
{
    return new_or_null(n, static_cast<std::size_t>(a), SITE);
}

HAK_EXPORT void operator delete(void *p) noexcept { hak_cxx_free(p); }
HAK_EXPORT void operator delete[](void *p) noexcept { hak_cxx_free(p); }
HAK_EXPORT void operator delete(void *p, const std::nothrow_t &) noexcept { hak_cxx_free(p); }
HAK_EXPORT void operator delete[](void *p, const std::nothrow_t &) noexcept { hak_cxx_free(p); }
HAK_EXPORT void operator delete(void *p, std::size_t) noexcept { hak_cxx_free(p); }
HAK_EXPORT void operator delete[](void *p, std::size_t) noexcept { hak_cxx_free(p); }
HAK_EXPORT void operator delete(void *p, std::align_val_t) noexcept { hak_cxx_free(p); }
HAK_EXPORT void operator delete[](void *p, std::align_val_t) noexcept { hak_cxx_free(p); }
HAK_EXPORT void operator delete(void *p, std::size_t, std::align_val_t) noexcept { hak_cxx_free(p); }
HAK_EXPORT void operator delete[](void *p, std::size_t, std::align_val_t) noexcept { hak_cxx_free(p); }
HAK_EXPORT void operator delete(void *p, std::align_val_t, const std::nothrow_t &) noexcept { hak_cxx_free(p); }
HAK_EXPORT void operator delete[](void *p, std::align_val_t, const std::nothrow_t &) noexcept { hak_cxx_free(p); }

#endif // HAKMEM_OVERRIDE
