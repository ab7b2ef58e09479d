#include "chat_template.h"
#include <stdlib.h>
struct ChatTemplate { int x; };
ChatTemplate *chat_template_compile(const char *source, Err *e) { return calloc(1, sizeof(ChatTemplate)); }
void chat_template_free(ChatTemplate *t) { free(t); }
int chat_template_render(const ChatTemplate *t, json_t *context, char **out, Err *e) { return ERR(e, 500, "todo"); }
