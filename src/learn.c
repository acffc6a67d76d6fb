/* The self-tuning policy (HAKMEM_MODE=evolving): a UCB1 bandit over the
 * large-block threshold, 64 KiB to 2 MiB.
 *
 * Time is cut into windows of HAKMEM_TUNE_WINDOW_MS, each run under one
 * arm. At a window's end its KPIs become a reward:
 *
 *     cost   = 0.5 L / L0 + 0.3 F / F0 + 0.2 R / R0,   reward = 1 / cost
 *
 * L: mean allocation latency (sampled timings, weighted by the
 * allocations each sample stands for, over the exact allocation count),
 * F: page faults per 1000 allocations, R: RSS; each against its value in
 * the first window, floored (20 ns, 1 fault, 32 MiB) so that a quiet first
 * window does not make every later one look much worse, nor a few MiB of
 * RSS noise in a small program weigh like a real change. A reward of 1 is
 * "as good as at the start".
 *
 * The arm in force changes only to a neighbour (one step), only after the
 * neighbour, tried in consecutive probe windows, beat the current arm's
 * mean by 8% three times in a row, and not again before the cooldown
 * (HAKMEM_TUNE_COOLDOWN_S) has passed. Which neighbour to probe, and when,
 * is UCB1's choice: the highest x / (1 + x) + sqrt(2 ln n / n_arm), x the
 * arm's mean reward over the current arm's, untried arms first (ties
 * broken by a generator seeded from HAKMEM_TUNE_SEED).
 *
 * A probe that loses by more than the margin rests its arm: not probed
 * again for twice as many windows as after its last loss (up to
 * TUNER_REST_MAX, so that a change in the program is seen within a
 * minute of default windows), over its reward's share of the current
 * arm's mean (a probe 50 times worse waits 50 times longer). A window the
 * probe wins, and a move of the arm in force, start the rests over. UCB1
 * alone kept probing: its bonus, above 1 for dozens of windows,
 * outweighs reward shares in [0, 1), and a threshold that sends 512K-1M
 * blocks to new mappings cost bench rss-time 13-48 us a malloc, every
 * third window (24 windows in 400 under an arm 50 times worse, 169 under
 * one 10% worse, in test_tuner). Every decision is logged with
 * HAKMEM_VERBOSE=1. */
#include "profile.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

const size_t tuner_arm_threshold[TUNER_ARMS] = {(size_t)64 << 10, (size_t)128 << 10, (size_t)256 << 10,
                                                (size_t)512 << 10, (size_t)1 << 20,    (size_t)2 << 20};

#define WEIGHT_LATENCY 0.5
#define WEIGHT_FAULTS 0.3
#define WEIGHT_RSS 0.2
#define FLOOR_LATENCY_NS 20.0
#define FLOOR_FAULTS_PER_K 1.0
#define FLOOR_RSS ((double)(32 << 20))

/* ---- the decision rule ------------------------------------------------------ */

/* Natural logarithm without libm (the static library needs no -lm):
 * x = m 2^e with m in [1, 2), ln m = 2 atanh((m - 1) / (m + 1)). */
static double ln(double x)
{
    union {
        double d;
        uint64_t u;
    } v = {.d = x};
    int e = (int)((v.u >> 52) & 0x7ff) - 1023;
    v.u = (v.u & ~((uint64_t)0x7ff << 52)) | ((uint64_t)1023 << 52);
    double y = (v.d - 1) / (v.d + 1), y2 = y * y, term = y, sum = 0;
    for (int k = 1; k < 20; k += 2, term *= y2)
        sum += term / k;
    return e * 0.69314718055994531 + 2 * sum;
}

static double max2(double a, double b) { return a > b ? a : b; }

void tuner_start(tuner_t *t, int arm, uint64_t cooldown_ms, uint64_t seed)
{
    *t = (tuner_t){.current = arm, .probe = -1, .cooldown_ms = cooldown_ms, .rng = seed | 1};
}

double tuner_mean_reward(const tuner_t *t, int arm)
{
    return t->trials[arm] ? t->reward_sum[arm] / (double)t->trials[arm] : 0;
}

/* reward as a share of the current arm's mean (itself where that mean is
 * not known yet). */
static double reward_share(const tuner_t *t, double reward)
{
    double current = tuner_mean_reward(t, t->current);
    return current > 0 ? reward / current : reward;
}

/* UCB1 over the current arm and its two neighbours not resting. */
static int ucb_choice(tuner_t *t)
{
    int candidates[3], n = 0, untried[3], n_untried = 0;
    for (int a = t->current - 1; a <= t->current + 1; a++)
        if (a >= 0 && a < TUNER_ARMS && (a == t->current || t->windows >= t->rest_until[a])) {
            candidates[n++] = a;
            if (!t->trials[a])
                untried[n_untried++] = a;
        }
    if (n_untried)
        return untried[xorshift64(&t->rng) % (uint64_t)n_untried];
    int best = t->current;
    double best_index = -1;
    for (int i = 0; i < n; i++) {
        int a = candidates[i];
        double x = reward_share(t, tuner_mean_reward(t, a));
        double index = x / (1 + x) + __builtin_sqrt(2 * ln((double)t->windows) / (double)t->trials[a]);
        if (index > best_index)
            best = a, best_index = index;
    }
    return best;
}

/* The probe of arm lost, its reward `share` of the current arm's mean.
 * Within the margin of the current arm it is a tie, noise as likely as
 * not (a loaded machine): it rests only where it lost by more. */
static void probe_lost(tuner_t *t, int arm, double share)
{
    if (share * TUNER_WIN_MARGIN >= 1)
        return;
    t->rest[arm] = t->rest[arm] ? (t->rest[arm] < TUNER_REST_MAX ? 2 * t->rest[arm] : TUNER_REST_MAX) : 1;
    double wait = (double)t->rest[arm] / max2(share, 1e-3);
    t->rest_until[arm] = t->windows + (wait < 1e6 ? (uint64_t)wait : 1000000);
}

/* A window under arm_ran earned reward; returns the arm for the next one. */
int tuner_decide(tuner_t *t, int arm_ran, double reward, uint64_t now_ms)
{
    t->trials[arm_ran]++;
    t->reward_sum[arm_ran] += reward;
    t->windows++;
    if (arm_ran == t->probe) {
        double share = reward_share(t, reward);
        if (share >= TUNER_WIN_MARGIN) {
            t->streak++;
            t->rest[arm_ran] = 0; /* a later loss costs one rest, not a doubled one */
        } else {
            probe_lost(t, arm_ran, share);
            t->probe = -1, t->streak = 0;
        }
        if (t->streak >= TUNER_WIN_STREAK) {
            t->current = arm_ran;
            t->probe = -1, t->streak = 0;
            t->moves++;
            t->cooldown_until_ms = now_ms + t->cooldown_ms;
            memset(t->rest, 0, sizeof t->rest);
            memset(t->rest_until, 0, sizeof t->rest_until);
        }
    }
    if (now_ms < t->cooldown_until_ms)
        return t->current;
    if (t->probe >= 0)
        return t->probe;
    int next = ucb_choice(t);
    if (next != t->current)
        t->probe = next, t->streak = 0;
    return next;
}

/* ---- windows of the running program -------------------------------------------- */

static pthread_mutex_t learn_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint64_t window_end_ms; /* 0: the tuner has not started */
static tuner_t tuner;
static int arm_running;
static bool have_reference;
static double ref_latency_ns, ref_faults, ref_rss;
static uint64_t win_latency_ticks, win_allocations, win_faults;

static int arm_of_threshold(size_t threshold)
{
    int arm = 0;
    while (arm + 1 < TUNER_ARMS && tuner_arm_threshold[arm] < threshold)
        arm++;
    return arm;
}

static uint64_t faults_now(void)
{
    uint64_t minor, major;
    os_page_faults(&minor, &major);
    return minor + major;
}

static void window_open(uint64_t now)
{
    kpi_window_counters(&win_latency_ticks, &win_allocations);
    win_faults = faults_now();
    atomic_store_explicit(&window_end_ms, now + (uint64_t)hak_config.tune_window_ms, memory_order_relaxed);
}

static void log_window(double latency_ns, double faults, double rss, double reward, int next, bool moved,
                       uint64_t now)
{
    char line[320], move[64] = "";
    const char *status = next != tuner.current ? "probe" : now < tuner.cooldown_until_ms ? "cooling down" : "current";
    if (moved)
        snprintf(move, sizeof move, "moved to %zuK (won %d windows by 8%%); ",
                 tuner_arm_threshold[tuner.current] >> 10, TUNER_WIN_STREAK);
    int n = snprintf(line, sizeof line,
                     "hakmem: tuner: window %llu under %zuK: %.0f ns/alloc, %.2f faults/1k allocs, %.1f MiB -> "
                     "reward %.3f; %snext %zuK (%s)\n",
                     (unsigned long long)tuner.windows, tuner_arm_threshold[arm_running] >> 10, latency_ns, faults,
                     rss / (1 << 20), reward, move, tuner_arm_threshold[next] >> 10, status);
    if (n > 0)
        os_write_stderr(line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

static void window_close(uint64_t now)
{
    uint64_t ticks, allocations;
    kpi_window_counters(&ticks, &allocations);
    allocations -= win_allocations;
    /* Nothing allocated, or nothing timed, is nothing to judge: bench
     * rss-time's first window read 0 ns, and its reward, 2.0 against
     * 0.05-0.3 for the later ones, made every probe look ten times worse. */
    if (!allocations || ticks == win_latency_ticks) {
        window_open(now);
        return;
    }
    double latency = (double)(ticks - win_latency_ticks) * kpi_ns_per_tick(false) / (double)allocations;
    double faults = 1000.0 * (double)(faults_now() - win_faults) / (double)allocations;
    double rss = (double)os_rss_bytes();
    if (!have_reference) {
        ref_latency_ns = max2(latency, FLOOR_LATENCY_NS);
        ref_faults = max2(faults, FLOOR_FAULTS_PER_K);
        ref_rss = max2(rss, FLOOR_RSS);
        have_reference = true;
    }
    double cost = WEIGHT_LATENCY * latency / ref_latency_ns + WEIGHT_FAULTS * faults / ref_faults +
                  WEIGHT_RSS * rss / ref_rss;
    double reward = 1 / max2(cost, 1e-6);
    uint64_t moves = tuner.moves;
    int next = tuner_decide(&tuner, arm_running, reward, now);
    if (hak_config.verbose)
        log_window(latency, faults, rss, reward, next, tuner.moves != moves, now);
    arm_running = next;
    __atomic_store_n(&hak_config.large_threshold, tuner_arm_threshold[next], __ATOMIC_RELAXED);
    window_open(now);
}

/* Called at samples, slab refills and timed large calls: closes the
 * window when due. */
void learn_tick(void)
{
    if (!hak_evolving())
        return;
    uint64_t end = atomic_load_explicit(&window_end_ms, memory_order_relaxed);
    uint64_t now = os_now_ms();
    if (end && now < end)
        return;
    if (pthread_mutex_trylock(&learn_lock) != 0)
        return;
    if (!hak_evolving()) { /* pinned since (learn_pin_threshold) */
        pthread_mutex_unlock(&learn_lock);
        return;
    }
    end = atomic_load_explicit(&window_end_ms, memory_order_relaxed);
    if (!end) {
        uint64_t seed = hak_config.tune_seed ? (uint64_t)hak_config.tune_seed : os_now_ns();
        arm_running = arm_of_threshold(hak_large_threshold());
        tuner_start(&tuner, arm_running, (uint64_t)hak_config.tune_cooldown_s * 1000, seed);
        __atomic_store_n(&hak_config.large_threshold, tuner_arm_threshold[arm_running], __ATOMIC_RELAXED);
        window_open(now);
    } else if (now >= end) {
        window_close(now);
    }
    pthread_mutex_unlock(&learn_lock);
}

/* The program set the threshold (mallopt's M_MMAP_THRESHOLD): it stays
 * there, and the tuner stops, as glibc stops moving its own threshold.
 * Under the lock, so that a window closing now cannot move it after. */
void learn_pin_threshold(size_t threshold)
{
    pthread_mutex_lock(&learn_lock);
    __atomic_store_n(&hak_config.mode, MODE_BASELINE, __ATOMIC_RELAXED);
    __atomic_store_n(&hak_config.large_threshold, threshold, __ATOMIC_RELAXED);
    tuner.current = arm_of_threshold(threshold);
    pthread_mutex_unlock(&learn_lock);
}

/* A fork may have caught another thread inside a window's close. */
void learn_fork_child(void) { pthread_mutex_init(&learn_lock, NULL); }

void learn_snapshot(tuner_t *out)
{
    pthread_mutex_lock(&learn_lock);
    *out = tuner;
    if (!atomic_load_explicit(&window_end_ms, memory_order_relaxed))
        out->current = arm_of_threshold(hak_large_threshold());
    pthread_mutex_unlock(&learn_lock);
}
