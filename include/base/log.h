/*
 * log.h - leveled logging to stderr with a timestamp.
 * Never log secrets (API key, admin token): callers pass only public data.
 */
#ifndef SAMPLER_LOG_H
#define SAMPLER_LOG_H

typedef enum { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 } LogLevel;
#define LOG_DEFAULT_LEVEL LOG_INFO /* until log_set_level */

void log_set_level(LogLevel lvl);
int log_parse_level(const char *s, LogLevel *out); /* 0 ok, -1 unknown name */
const char *log_level_name(LogLevel lvl);         /* "debug" "info" "warn" "error" */
void log_msg(LogLevel lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

#endif
