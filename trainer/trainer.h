/*
 * trainer.h - the trainer CLI's subcommands (the delta source) and their
 * shared helpers. Private to trainer/. CLI errors are fatal (CHECK) with a
 * message that says what to fix; the library calls underneath return Err.
 */
#ifndef SAMPLER_TRAINER_H
#define SAMPLER_TRAINER_H

#include <stddef.h>
#include <stdint.h>

int cmd_diff(int argc, char **argv);
int cmd_apply(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_fingerprint(int argc, char **argv);
int cmd_push(int argc, char **argv);
int cmd_push_lora(int argc, char **argv);
int cmd_sign(int argc, char **argv);
int cmd_membw(int argc, char **argv);

double now_s(void);
/* Whole file into memory (fatal on error). */
uint8_t *read_file(const char *path, size_t *size);
/* Write a file so a crash leaves either the old state or the whole new file:
 * temp file in the same directory, fsync, rename, fsync the directory. */
void write_file_atomic(const char *path, const void *data, size_t size);
void fsync_dir(const char *dir);
/* dst = a/b (fatal if it does not fit). */
void path_join(char *dst, size_t cap, const char *a, const char *b);
uint64_t parse_hex64(const char *s);
int default_threads(void);

#endif
