/**
 * The ordered global catalog of session groups (design §4.3 sessions group_list / group_set /
 * group_rename / group_delete), as pure rules. Names are unique ignoring case; the order is
 * the caller's. Every change raises the catalog version, and a change can be made
 * conditional on the version the caller last read, so two editors never silently overwrite
 * each other.
 */
import { failedPrecondition, invalidArgument, notFound } from "../errors.js";
import { checkOneLine } from "../validation.js";

export const MAX_GROUPS = 100;
export const MAX_GROUP_NAME_CHARS = 64;

export interface GroupCatalog {
  /** In order. */
  groups: string[];
  /** 0 = never set; +1 per change. */
  version: number;
}

/** Identity of a name: case and Unicode composition do not make two groups different. */
export function groupIdentity(name: string): string {
  return name.normalize("NFC").toLowerCase();
}

export function checkGroupName(field: string, name: string): string {
  if (name.trim() === "") throw invalidArgument(field, "must not be empty");
  if (name !== name.trim()) throw invalidArgument(field, "must not start or end with whitespace");
  if ([...name].length > MAX_GROUP_NAME_CHARS) throw invalidArgument(field, `must be at most ${MAX_GROUP_NAME_CHARS} characters`);
  checkOneLine(field, name, MAX_GROUP_NAME_CHARS * 4);
  return name.normalize("NFC");
}

/** A whole new catalog: every name valid, no two equal ignoring case, at most MAX_GROUPS. */
export function checkGroupList(names: readonly string[]): string[] {
  if (names.length > MAX_GROUPS) throw invalidArgument("groups", `must hold at most ${MAX_GROUPS} groups (got ${names.length})`);
  const seen = new Map<string, number>();
  return names.map((name, i) => {
    const checked = checkGroupName(`groups[${i}].name`, name);
    const earlier = seen.get(groupIdentity(checked));
    if (earlier !== undefined) throw invalidArgument(`groups[${i}].name`, `"${name}" repeats groups[${earlier}] (names are unique ignoring case)`);
    seen.set(groupIdentity(checked), i);
    return checked;
  });
}

/** FAILED_PRECONDITION when the caller's expected version is not the current one. */
export function checkExpectedVersion(catalog: GroupCatalog, expected: number | undefined): void {
  if (expected !== undefined && expected !== catalog.version) {
    throw failedPrecondition(`group catalog is at version ${catalog.version}, not the expected ${expected}; read it again and retry`);
  }
}

function indexOf(groups: readonly string[], name: string): number {
  const id = groupIdentity(name);
  const i = groups.findIndex((g) => groupIdentity(g) === id);
  if (i < 0) throw notFound(`group "${name}" is not in the catalog`);
  return i;
}

/** The catalog with one group renamed in place. Renaming to another group's name is refused. */
export function renameInCatalog(groups: readonly string[], name: string, newName: string): string[] {
  const target = checkGroupName("new_name", newName);
  const i = indexOf(groups, name);
  const clash = groups.findIndex((g, j) => j !== i && groupIdentity(g) === groupIdentity(target));
  if (clash >= 0) throw failedPrecondition(`group "${groups[clash]}" already exists`);
  return groups.map((g, j) => (j === i ? target : g));
}

/** The catalog without one group; the others keep their order. */
export function removeFromCatalog(groups: readonly string[], name: string): string[] {
  const i = indexOf(groups, name);
  return groups.filter((_, j) => j !== i);
}
