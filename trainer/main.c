/*
 * main.c - `trainer`: the delta source of RL training. Diffs consecutive
 * checkpoints into delta containers, applies them offline, pushes them to
 * running samplers and inspects them. See docs/delta-format.md.
 */
#include <curl/curl.h>
#include <stdio.h>
#include <string.h>

#include "trainer.h"

static void usage(void) {
    fprintf(stderr,
            "usage:\n"
            "  trainer diff OLD NEW -o step.delta [--base-version N] [--target-version M]\n"
            "               [--fingerprint HEX] [--level L] [--threads T] [--values raw|xor]\n"
            "  trainer apply BASE step.delta -o OUT [--fingerprint HEX] [--threads T]\n"
            "  trainer inspect step.delta   (checks every payload too: exit 1 if corrupt)\n"
            "  trainer fingerprint DIR [--version N] [--fingerprint HEX]  (prints the GET /admin/v1/weights view)\n"
            "  trainer push step.delta (--to URL ... | --targets FILE | --router URL [--router-key K])\n"
            "               [--admin-token T] [--deadline S] [--retries N] [--chain DIR [--max-chain K]]\n"
            "               [--reload CKPT_DIR] [--key-file K] [--cacert FILE] [--insecure]\n"
            "               (a fleet: catches up samplers behind the delta's base; docs/fleet.md)\n"
            "  trainer push-lora DIR --name NAME --to URL [--to URL ...] [--inplace] [--admin-token T]\n"
            "               [--key-file K] [--retries N] [--cacert FILE] [--insecure]  (a PEFT LoRA adapter)\n"
            "  trainer sign step.delta --key-file K   (writes step.delta.sig: HMAC-SHA256 for --delta-key-file)\n"
            "  trainer membw [--mb N]      (memory-copy bandwidth, for benchmarks)\n"
            "OLD/NEW/BASE are Hugging Face checkpoint directories (sharded safetensors).\n"
            "Versions are at most 2^62; identical OLD and NEW give a version-only delta.\n"
            "The admin token may also come from the SAMPLER_ADMIN_TOKEN environment variable.\n"
            "https:// URLs verify the sampler's certificate (system CAs or --cacert); --insecure skips that.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage();
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "diff") == 0) return cmd_diff(argc - 1, argv + 1);
    if (strcmp(cmd, "apply") == 0) return cmd_apply(argc - 1, argv + 1);
    if (strcmp(cmd, "inspect") == 0) return cmd_inspect(argc - 1, argv + 1);
    if (strcmp(cmd, "fingerprint") == 0) return cmd_fingerprint(argc - 1, argv + 1);
    if (strcmp(cmd, "sign") == 0) return cmd_sign(argc - 1, argv + 1);
    if (strcmp(cmd, "membw") == 0) return cmd_membw(argc - 1, argv + 1);
    if (strcmp(cmd, "push-lora") == 0) {
        curl_global_init(CURL_GLOBAL_DEFAULT);
        int rc = cmd_push_lora(argc - 1, argv + 1);
        curl_global_cleanup();
        return rc;
    }
    if (strcmp(cmd, "push") == 0) {
        curl_global_init(CURL_GLOBAL_DEFAULT);
        int rc = cmd_push(argc - 1, argv + 1);
        curl_global_cleanup();
        return rc;
    }
    usage();
    return 2;
}
