#!/bin/sh
# Render the documented ACL template (users.acl) into the file Redis loads, then run the rest of the command line:
#
#   render-acl.sh TEMPLATE OUTPUT [COMMAND [ARG...]]
#
# Redis's ACL file has no comments and one line per user; the template has both (see its header). Each `>${NAME}`
# becomes `#<sha256 of $NAME>`, so the rendered file holds no plain-text password. In docker-compose.yml this is the
# Redis container's entrypoint, in front of the official image's own:
#
#   render-acl.sh users.acl /run/redis/users.acl docker-entrypoint.sh redis-server redis.conf
#
# POSIX sh, awk, sed, grep and sha256sum: what the redis:7 image has.
set -eu

if [ "$#" -lt 2 ]; then
    echo "usage: render-acl.sh TEMPLATE OUTPUT [COMMAND [ARG...]]" >&2
    exit 2
fi
template=$1
output=$2
shift 2

# One line per user: comments and blank lines out, indented continuation lines joined to their `user` line.
rules=$(awk '
    { sub(/\r$/, ""); sub(/[ \t]+$/, "") }
    /^[ \t]*(#|$)/ { next }
    /^user[ \t]/ { if (line != "") print line; line = $0; next }
    /^[ \t]/ && line != "" { sub(/^[ \t]+/, ""); sub(/[ \t]+$/, ""); line = line " " $0; next }
    {
        printf "render-acl: %s:%d: not a comment, a user line or an indented continuation: %s\n", FILENAME, FNR, $0 > "/dev/stderr"
        bad = 1
        exit 1
    }
    END { if (bad) exit 1; if (line != "") print line }
' "$template")

# Passwords from the environment, hashed. An unset or empty variable stops here rather than start Redis without it.
names=$(printf '%s\n' "$rules" | grep -o '>\${[A-Za-z_][A-Za-z0-9_]*}' | sed 's/^>\${\(.*\)}$/\1/' | sort -u || true)
for name in $names; do
    eval "value=\${$name-}"
    if [ -z "$value" ]; then
        echo "render-acl: $name is unset or empty; set it to the password of its user (see deploy/README.md)" >&2
        exit 1
    fi
    hash=$(printf '%s' "$value" | sha256sum | cut -d ' ' -f 1)
    rules=$(printf '%s\n' "$rules" | sed "s/>\\\${$name}/#$hash/g")
done
case $rules in
    *'${'*)
        echo "render-acl: $template: a \${...} placeholder is left; passwords are written >\${NAME}" >&2
        exit 1
        ;;
esac

umask 077
mkdir -p "$(dirname "$output")"
printf '%s\n' "$rules" > "$output.tmp.$$"
mv "$output.tmp.$$" "$output"
# Rendered as root in the official image, read by redis-server after it has dropped to the redis user.
if [ "$(id -u)" = 0 ] && id redis > /dev/null 2>&1; then
    chown redis "$output"
fi

# Redis needs the hashes only: the passwords leave its environment.
for name in $names; do
    unset "$name"
done
if [ "$#" -gt 0 ]; then
    exec "$@"
fi
