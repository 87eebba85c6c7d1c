#!/usr/bin/env bash
# Make sure a local MariaDB (or MySQL) answers on 127.0.0.1:3306 and the `test` database exists.
# Exit 0: ready. Exit 3: no MariaDB/MySQL server is installed here. Exit 1: installed but unusable.
# MYSQL_HOST, MYSQL_TCP_PORT, MYSQL_USER, MYSQL_PWD and MYSQL_DATABASE override the defaults
# (127.0.0.1, 3306, root, no password, test); tests/settings.py reads the same variables.
set -uo pipefail
export MYSQL_HOST=${MYSQL_HOST:-127.0.0.1} MYSQL_TCP_PORT=${MYSQL_TCP_PORT:-3306}
user=${MYSQL_USER:-root}
export PATH=$PATH:/usr/sbin:/usr/local/sbin

client=$(command -v mariadb || command -v mysql || true)
admin=$(command -v mariadb-admin || command -v mysqladmin || true)
server=$(command -v mariadbd || command -v mysqld || true)

# Answers over TCP (not the socket: the tests connect over TCP) and lets $user in.
ready() { [ -n "$admin" ] && "$admin" --protocol=TCP -u "$user" --connect-timeout=2 ping >/dev/null 2>&1; }

if [ -z "$client" ] || { [ -z "$server" ] && ! ready; }; then
  exit 3
fi
if ! ready; then
  if ! pgrep -x 'mariadbd|mysqld' >/dev/null 2>&1; then  # else it is starting: wait for it
    echo "Starting MariaDB ..."
    # No systemd here. Debian's SysV script checks liveness with /etc/mysql/debian.cnf: without that
    # file it waits 30 s and reports a failure even when the server came up, so then start the
    # mysqld_safe wrapper in the background ourselves, as that script would.
    safe=$(command -v mariadbd-safe || command -v mysqld_safe || true)
    if [ -f /etc/mysql/debian.cnf ] && [ -x /etc/init.d/mariadb ] && command -v service >/dev/null 2>&1; then
      service mariadb start >/dev/null 2>&1 </dev/null
    elif [ -f /etc/mysql/debian.cnf ] && [ -x /etc/init.d/mysql ] && command -v service >/dev/null 2>&1; then
      service mysql start >/dev/null 2>&1 </dev/null
    elif [ -n "$safe" ]; then
      install -d -m 755 -o mysql -g root /run/mysqld 2>/dev/null
      nohup "$safe" >"${TMPDIR:-/tmp}/mariadbd-safe.log" 2>&1 </dev/null &
      disown
    fi
  fi
  for _ in $(seq 1 60); do ready && break; sleep 0.5; done
fi
if ! ready; then
  echo "MariaDB is installed but does not answer on $MYSQL_HOST:$MYSQL_TCP_PORT (as $user)." >&2
  exit 1
fi
db=${MYSQL_DATABASE:-test}
"$client" --protocol=TCP -u "$user" -e "CREATE DATABASE IF NOT EXISTS \`$db\` CHARACTER SET utf8mb4" ||
  { echo "Could not create database $db" >&2; exit 1; }
exit 0
