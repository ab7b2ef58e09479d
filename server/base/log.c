/*
 * log.c - leveled stderr logging (see log.h). Thread-safe: one fprintf per line.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static LogLevel g_level = LOG_DEFAULT_LEVEL;
static const char *g_names[] = {"debug", "info", "warn", "error"};

void log_set_level(LogLevel lvl) { g_level = lvl; }

const char *log_level_name(LogLevel lvl) { return lvl >= LOG_DEBUG && lvl <= LOG_ERROR ? g_names[lvl] : "?"; }

int log_parse_level(const char *s, LogLevel *out) {
    for (int i = 0; i < 4; i++)
        if (strcmp(s, g_names[i]) == 0) { *out = (LogLevel)i; return 0; }
    return -1;
}

void log_msg(LogLevel lvl, const char *fmt, ...) {
    if (lvl < g_level) return;
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03ld %-5s ", tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, g_names[lvl]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}
